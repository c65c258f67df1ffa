//go:build tools

// Package apiserver pins kube-apiserver for the discovery tests' build script.
package apiserver

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
