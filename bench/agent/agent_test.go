package agentbench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentenv/agentenv/guest/agent/agentclient"
	"github.com/agentenv/agentenv/guest/agent/agenttest"
)

const (
	starts   = 300       // process starts per side
	fileSize = 256 << 20 // bytes per transfer
	copyBuf  = 1 << 20
	rounds   = 3
)

// BenchmarkProcessStart: agent Start of /bin/true (start event to end event)
// against exec of /bin/true.
func BenchmarkProcessStart(b *testing.B) {
	srv := agenttest.Start(b)
	ctx := context.Background()
	hc := &http.Client{}
	// Warm up both paths (connection, page cache).
	for range 10 {
		if _, _, _, err := agentclient.Run(ctx, srv.URL, hc, "/bin/true"); err != nil {
			b.Fatal(err)
		}
		if err := exec.Command("/bin/true").Run(); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for range b.N {
		// Interleave the two so that machine noise hits both alike.
		var agentT, forkT time.Duration
		for range starts {
			t0 := time.Now()
			if _, _, code, err := agentclient.Run(ctx, srv.URL, hc, "/bin/true"); err != nil || code != 0 {
				b.Fatal(code, err)
			}
			t1 := time.Now()
			if err := exec.Command("/bin/true").Run(); err != nil {
				b.Fatal(err)
			}
			agentT += t1.Sub(t0)
			forkT += time.Since(t1)
		}
		a, f := agentT/starts, forkT/starts
		ratio := float64(a) / float64(f)
		b.ReportMetric(float64(a.Microseconds()), "agent-µs/start")
		b.ReportMetric(float64(f.Microseconds()), "forkexec-µs/start")
		b.ReportMetric(ratio, "ratio")
		fmt.Printf("process start: agent %v/start, bare fork/exec %v/start, ratio %.2fx (overhead %v)\n", a, f, ratio, a-f)
	}
}

// BenchmarkFileTransfer: upload and download of a 256 MiB file through
// /files against copying the same file locally with the same buffer size.
func BenchmarkFileTransfer(b *testing.B) {
	srv := agenttest.Start(b)
	dir := b.TempDir()
	src := filepath.Join(dir, "src.bin")
	if err := writePattern(src, fileSize); err != nil {
		b.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	b.ResetTimer()
	for range b.N {
		// Best of a few interleaved rounds: the first writes of a round pay
		// for dirty-page writeback of the previous one, whichever copy it is.
		local, up, down := time.Duration(1<<62), time.Duration(1<<62), time.Duration(1<<62)
		for range rounds {
			local = min(local, timeIt(b, func() error { return copyFile(filepath.Join(dir, "local.bin"), src) }))
			up = min(up, timeIt(b, func() error { return upload(hc, srv.URL, filepath.Join(dir, "up.bin"), src) }))
			down = min(down, timeIt(b, func() error {
				return download(hc, srv.URL, filepath.Join(dir, "up.bin"), filepath.Join(dir, "down.bin"))
			}))
			for _, f := range []string{"local.bin", "up.bin", "down.bin"} {
				os.Remove(filepath.Join(dir, f))
			}
		}
		mbps := func(d time.Duration) float64 { return float64(fileSize) / (1 << 20) / d.Seconds() }
		b.ReportMetric(mbps(local), "local-MiB/s")
		b.ReportMetric(mbps(up), "upload-MiB/s")
		b.ReportMetric(mbps(down), "download-MiB/s")
		b.ReportMetric(local.Seconds()/up.Seconds(), "upload-ratio")
		b.ReportMetric(local.Seconds()/down.Seconds(), "download-ratio")
		fmt.Printf("files (%d MiB, best of %d): local copy %.0f MiB/s, upload %.0f MiB/s (%.2fx of local), download %.0f MiB/s (%.2fx of local)\n",
			fileSize>>20, rounds, mbps(local), mbps(up), local.Seconds()/up.Seconds(), mbps(down), local.Seconds()/down.Seconds())
	}
}

func timeIt(b *testing.B, fn func() error) time.Duration {
	b.Helper()
	t0 := time.Now()
	if err := fn(); err != nil {
		b.Fatal(err)
	}
	return time.Since(t0)
}

func writePattern(path string, size int) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	buf := make([]byte, copyBuf)
	for off := 0; off < size; off += len(buf) {
		for i := range buf {
			x := uint64(off + i)
			buf[i] = byte(x ^ x>>9 ^ x>>21)
		}
		if _, err := f.Write(buf); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}

// onlyWriter and onlyReader hide ReadFrom/WriteTo so that every copy moves
// bytes through user space with the same buffer, as the agent does.
type onlyWriter struct{ io.Writer }
type onlyReader struct{ io.Reader }

func copyFile(dst, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.CopyBuffer(onlyWriter{out}, onlyReader{in}, make([]byte, copyBuf)); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func upload(hc *http.Client, base, dst, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	req, err := http.NewRequest(http.MethodPost, base+"/files?path="+url.QueryEscape(dst), in)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	req.ContentLength = fileSize // as the SDK sends it; not chunked
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("upload: status %d", resp.StatusCode)
	}
	_, err = io.Copy(io.Discard, resp.Body)
	return err
}

func download(hc *http.Client, base, src, dst string) error {
	resp, err := hc.Get(base + "/files?path=" + url.QueryEscape(src))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("download: status %d", resp.StatusCode)
	}
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	n, err := io.CopyBuffer(onlyWriter{out}, onlyReader{resp.Body}, make([]byte, copyBuf))
	if err != nil {
		out.Close()
		return err
	}
	if n != fileSize {
		out.Close()
		return fmt.Errorf("download: %d bytes, want %d", n, fileSize)
	}
	return out.Close()
}
