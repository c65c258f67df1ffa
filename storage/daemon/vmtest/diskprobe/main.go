// Command diskprobe is the program of the small guest that the kernel-lane
// test of QEMU on kernel block devices boots (under laneinit, inside the
// lane): it reads the first MiB of its disk /dev/vda and prints the
// SHA-256, writes a marker at 1 MiB and flushes it, then prints a counter
// every 100 ms forever. A guest restored from a snapshot of it shows that it
// runs on the memory it was restored from by going on counting.
package main

import (
	"crypto/sha256"
	"fmt"
	"os"
	"time"
)

// Marker is what the probe writes at MarkerOffset of its disk.
const (
	Marker       = "diskprobe was here"
	MarkerOffset = 1 << 20
)

func main() {
	if err := probe("/dev/vda"); err != nil {
		fmt.Println("DISKPROBE error:", err)
		os.Exit(1)
	}
	for n := 1; ; n++ {
		fmt.Printf("DISKPROBE tick %d\n", n)
		time.Sleep(100 * time.Millisecond)
	}
}

func probe(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, MarkerOffset)
	if _, err := f.ReadAt(buf, 0); err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	fmt.Printf("DISKPROBE sha256 %x\n", sha256.Sum256(buf))
	if _, err := f.WriteAt([]byte(Marker), MarkerOffset); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("flush %s: %w", path, err)
	}
	fmt.Println("DISKPROBE flushed")
	return nil
}
