package disk

import (
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/storage/blob"
)

// LocalDisk says whether every layer of the disk config is a local file
// (a disk still read from URLs moves onto local files under a device of
// its own, lazy.go).
func LocalDisk(config string) bool {
	layers, err := snapshot.LayersOf(config)
	if err != nil || len(layers) == 0 {
		return false
	}
	for _, l := range layers {
		if blob.IsURL(l) {
			return false
		}
	}
	return true
}
