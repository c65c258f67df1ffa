package nettest

import (
	"github.com/google/nftables"
	"github.com/vishvananda/netns"
)

// listTables returns the names of all nft tables in the namespace at path.
func listTables(path string) ([]string, error) {
	var opts []nftables.ConnOption
	if path != "" {
		h, err := netns.GetFromPath(path)
		if err != nil {
			return nil, err
		}
		defer h.Close()
		opts = append(opts, nftables.WithNetNSFd(int(h)))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return nil, err
	}
	ts, err := c.ListTables()
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(ts))
	for _, t := range ts {
		names = append(names, t.Name)
	}
	return names, nil
}
