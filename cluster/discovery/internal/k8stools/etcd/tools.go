//go:build tools

// Package etcd pins etcd for the discovery tests' build script.
package etcd

import _ "go.etcd.io/etcd/server/v3"
