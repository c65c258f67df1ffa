package network_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/testenv"
	"github.com/agentenv/agentenv/network"
	"github.com/vishvananda/netlink"
)

// TestQEMUAcceptsTap hands the file from OpenTap to a real QEMU, as the
// vmm layer does, asks QEMU (QMP) what its network backend is, and checks
// the tap has carrier once only QEMU holds it. QEMU runs with its vCPUs
// stopped and no guest, so this costs no emulation.
func TestQEMUAcceptsTap(t *testing.T) {
	t.Parallel()
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		testenv.Missing(t, "qemu-system-x86_64 not installed")
	}
	m, _ := newManager(t, nil)
	s := acquire(t, m)
	tap, err := s.OpenTap()
	if err != nil {
		t.Fatalf("OpenTap: %v", err)
	}
	defer tap.Close()
	qmpPath := filepath.Join(t.TempDir(), "qmp.sock")
	var stderr bytes.Buffer
	cmd := exec.Command(qemu, "-M", "microvm", "-accel", "tcg", "-S", "-nodefaults", "-display", "none",
		"-qmp", "unix:"+qmpPath+",server=on,wait=off",
		"-netdev", "tap,id=n0,fd=3,vhost=off",
		"-device", "virtio-net-device,netdev=n0,mac="+network.GuestMAC.String())
	cmd.ExtraFiles = []*os.File{tap}
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	tap.Close() // QEMU has its own copy now

	info, err := qmpHMP(qmpPath, "info network")
	if err != nil {
		t.Fatalf("qmp: %v (qemu stderr: %s)", err, strings.TrimSpace(stderr.String()))
	}
	if !strings.Contains(info, "type=tap") {
		t.Fatalf("qemu's network has no tap backend:\n%s", info)
	}
	if !tapCarrier(t, s) {
		t.Fatalf("tap has no carrier while qemu holds it")
	}
}

// qmpHMP runs a monitor command over QMP at path, waiting for the socket.
func qmpHMP(path, command string) (string, error) {
	var c net.Conn
	var err error
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if c, err = net.Dial("unix", path); err == nil {
			break
		}
	}
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	r := bufio.NewReader(c)
	if _, err := r.ReadBytes('\n'); err != nil { // greeting
		return "", err
	}
	fmt.Fprintln(c, `{"execute":"qmp_capabilities"}`)
	if _, err := r.ReadBytes('\n'); err != nil {
		return "", err
	}
	req, _ := json.Marshal(map[string]any{"execute": "human-monitor-command",
		"arguments": map[string]string{"command-line": command}})
	c.Write(append(req, '\n'))
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return "", err
		}
		var resp struct {
			Return *string         `json:"return"`
			Error  json.RawMessage `json:"error"`
		}
		if json.Unmarshal(line, &resp) != nil {
			continue
		}
		if resp.Error != nil {
			return "", fmt.Errorf("%s", resp.Error)
		}
		if resp.Return != nil {
			return *resp.Return, nil
		}
	}
}

func tapCarrier(t *testing.T, s *network.Slot) bool {
	var up bool
	err := network.RunInNetNS(s.NetNSPath(), func() error {
		l, err := netlink.LinkByName(network.TapName)
		if err == nil {
			up = l.Attrs().OperState == netlink.OperUp
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return up
}
