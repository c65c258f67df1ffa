package failpoint

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
)

// ControlEnvVar names a Unix socket path on which a process arms points at
// run time (tests only): one line "name=action" (or "name=" to disarm) per
// connection, answered "ok" or "error: ...". A crash matrix arms the next
// point over it instead of restarting the process for each.
const ControlEnvVar = "AENV_FAILPOINTS_CONTROL"

// ServeControl serves the control socket named by ControlEnvVar, if set,
// until ctx ends; stop waits for the server to be gone.
func ServeControl(ctx context.Context) (stop func(), err error) {
	path := os.Getenv(ControlEnvVar)
	if path == "" {
		return func() {}, nil
	}
	_ = os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("failpoint control %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("failpoint control %s: %w", path, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		<-ctx.Done()
		ln.Close()
	}()
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			handleControl(c)
		}
	}()
	return func() { cancel(); wg.Wait(); _ = os.Remove(path) }, nil
}

func handleControl(c net.Conn) {
	defer c.Close()
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return
	}
	name, spec, _ := strings.Cut(strings.TrimSpace(line), "=")
	if err := Arm(name, spec); err != nil {
		fmt.Fprintf(c, "error: %v\n", err)
		return
	}
	fmt.Fprintln(c, "ok")
}

// ArmRemote arms a point in the process serving the control socket path.
func ArmRemote(path, name, spec string) error {
	c, err := net.Dial("unix", path)
	if err != nil {
		return fmt.Errorf("failpoint control %s: %w", path, err)
	}
	defer c.Close()
	if _, err := fmt.Fprintf(c, "%s=%s\n", name, spec); err != nil {
		return fmt.Errorf("failpoint control %s: %w", path, err)
	}
	reply, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return fmt.Errorf("failpoint control %s: %w", path, err)
	}
	if reply = strings.TrimSpace(reply); reply != "ok" {
		return fmt.Errorf("arm %s=%s: %s", name, spec, reply)
	}
	return nil
}
