// Package composeguest is the compose-v1 template: the guest that runs the
// Compose projects of POST /sandboxes-compose. Its root filesystem is the
// node's default one plus Debian's Docker Engine and Compose (bookworm:
// docker.io 20.10 with its containerd and runc, and docker-compose 1.29,
// the Python Compose, invoked as docker-compose) and the guest kernel's
// modules that Docker's bridge networks need (image.DockerModules, loaded
// by dockerd through the tree's modprobe). The template is built on the
// node from Variant with StartCmd starting dockerd, so its snapshot holds
// a running daemon; the node hands every image in (package composeup):
// nothing in the guest pulls from a registry.
package composeguest

import (
	"time"

	"github.com/agentenv/agentenv/guest/image"
)

// TemplateName is the template's id and name.
const TemplateName = "compose-v1"

// Packages are the Debian packages the variant adds (kmod for modprobe
// and depmod).
var Packages = []string{"docker.io", "docker-compose", "kmod", "iptables"}

// StartCmd starts dockerd in the background of the build VM, as root (the
// template's commands run as root). The agent is PID 1 (no systemd):
// dockerd starts its own containerd. Its log goes to /var/log/dockerd.log.
// The sandbox's user joins the docker group first, so that `docker` works
// for it as for a Docker host's users.
const StartCmd = "usermod -aG docker user && exec /usr/sbin/dockerd >/var/log/dockerd.log 2>&1"

// ReadyCmd succeeds once the daemon answers.
const ReadyCmd = "docker info >/dev/null"

// ReadyTimeout bounds the build's wait for ReadyCmd (dockerd's first
// start sets up its state and networks; minutes under emulation).
const ReadyTimeout = 10 * time.Minute

// MinMemoryMiB is the least memory the template's VM gets: the daemon,
// containerd and a project's containers.
const MinMemoryMiB = 1024

// RootfsMiB sizes the variant's root filesystem (sparse: only what is
// written takes space): a project's images are handed in as one archive
// and loaded beside it, so they need twice their size for a moment.
const RootfsMiB = 16384

// Variant is the template's root filesystem variant.
func Variant() image.Variant {
	return image.Variant{Name: TemplateName, Packages: Packages, Modules: image.DockerModules, RootfsMiB: RootfsMiB}
}
