package client_test

import (
	"context"
	"fmt"

	"github.com/agentenv/agentenv/storage/daemon/client"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
)

// How aenvd drives the daemon over a sandbox's life. (Compiled, not run.)
func Example() {
	ctx := context.Background()
	c, err := client.Ensure(ctx, client.StartOptions{
		Socket: "/run/aenv-storaged/storaged.sock",
		Binary: "/usr/local/bin/aenv-storaged",
		Args:   []string{"-state-dir", "/var/lib/aenv-storaged", "-run-dir", "/run/aenv-storaged"},
	})
	if err != nil {
		panic(err)
	}
	defer c.Close()

	// After an aenvd restart: drop devices of sandboxes that no longer exist.
	c.Reclaim(ctx, "aenvd", 3, 7)

	// Create: a writable rootfs on the template's layers, and the shared
	// memory image of the snapshot.
	root, _ := c.Create(ctx, rpc.CreateParams{Image: "/snapshots/t1/rootfs.json", Owner: "aenvd"})
	mem, _ := c.AcquireShared(ctx, "/snapshots/t1/memory.json", "aenvd/sb-42")
	fmt.Println(root.Socket, root.Export, mem.URI) // vmm.NBDSource{Socket, Export}

	// Pause: seal the rootfs upper into the new snapshot's layer.
	res, _ := c.Restack(ctx, rpc.RestackParams{ID: root.ID, Layer: "/snapshots/t2/rootfs-2.lsmt"})
	fmt.Println(res.Digest, res.Size)

	// Kill: delete the rootfs device, drop the memory reference.
	c.Delete(ctx, root.ID)
	c.ReleaseShared(ctx, mem.ID, "aenvd/sb-42")
}
