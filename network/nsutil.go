package network

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NetNSDir is where named namespaces are bind-mounted (as `ip netns` does).
const NetNSDir = "/run/netns"

// NetNSPath returns the bind-mount path of the named namespace.
func NetNSPath(name string) string { return filepath.Join(NetNSDir, name) }

// runInNS runs fn on a dedicated OS thread switched into the namespace at
// nsPath ("" runs it in the process's namespace). The thread is discarded
// if it cannot be switched back, so no goroutine ever runs in the wrong
// namespace.
func runInNS(nsPath string, fn func() error) error {
	if nsPath == "" {
		return fn()
	}
	target, err := netns.GetFromPath(nsPath)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", nsPath, err)
	}
	defer target.Close()
	return runInHandle(target, fn)
}

func runInHandle(target netns.NsHandle, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		origin, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("get current netns: %w", err)
			return
		}
		defer origin.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter netns: %w", err)
			return
		}
		ferr := fn()
		if err := netns.Set(origin); err != nil {
			// Leave the thread locked: Go terminates it with this goroutine.
			errc <- errors.Join(ferr, fmt.Errorf("restore netns: %w", err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// createNamedNS creates a network namespace and bind-mounts it at
// NetNSDir/name, like `ip netns add`.
func createNamedNS(name string) error {
	if err := os.MkdirAll(NetNSDir, 0o755); err != nil {
		return fmt.Errorf("create netns %s: %w", name, err)
	}
	path := NetNSPath(name)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return fmt.Errorf("create netns %s: %w", name, err)
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		origin, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer origin.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		merr := unix.Mount("/proc/thread-self/ns/net", path, "none", unix.MS_BIND, "")
		if err := netns.Set(origin); err != nil {
			errc <- errors.Join(merr, fmt.Errorf("restore netns: %w", err))
			return // thread stays locked and dies with the goroutine
		}
		runtime.UnlockOSThread()
		errc <- merr
	}()
	if err := <-errc; err != nil {
		os.Remove(path)
		return fmt.Errorf("create netns %s: %w", name, err)
	}
	return nil
}

// deleteNamedNS unmounts and removes a named namespace. The kernel frees
// the namespace (and every device and rule in it) once nothing holds it.
// A missing namespace is not an error.
func deleteNamedNS(name string) error {
	path := NetNSPath(name)
	err := unix.Unmount(path, unix.MNT_DETACH)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("delete netns %s: unmount: %w", name, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("delete netns %s: %w", name, err)
	}
	return nil
}

// writeSysctl writes value to /proc/sys/<key> in the current thread's
// namespace (call it inside runInNS for another namespace).
func writeSysctl(key, value string) error {
	p := filepath.Join("/proc/sys", key)
	if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
		return fmt.Errorf("sysctl %s=%s: %w", key, value, err)
	}
	return nil
}

// CreateNamedNetNS creates an empty named network namespace at
// NetNSPath(name), like `ip netns add`.
func CreateNamedNetNS(name string) error { return createNamedNS(name) }

// DeleteNamedNetNS removes a named namespace; a missing one is not an error.
func DeleteNamedNetNS(name string) error { return deleteNamedNS(name) }

// RunInNetNS runs fn on an OS thread inside the namespace at path. Sockets
// fn creates stay in that namespace after it returns.
func RunInNetNS(path string, fn func() error) error { return runInNS(path, fn) }
