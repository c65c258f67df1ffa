package daemon

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/lsmt"
)

// recover brings the state directory to a consistent state and re-exports
// every device in it, or marks it lost. In order: the trash is emptied
// (deletes whose rename landed), directories without a record are removed
// (creates that never committed), each device's restack journal is
// finished or rolled back, files in a device directory that its record does
// not name are removed (temporaries, generations of a cut restack), and
// export sockets no live device owns are removed. Every removal is logged.
func (d *Daemon) recover() error {
	if err := d.emptyTrash(); err != nil {
		return err
	}
	recs, broken, err := d.scanState()
	if err != nil {
		return err
	}
	for id, why := range broken {
		d.ids.reserve(id)
		d.devices[id] = &device{rec: record{ID: id}, lost: "unreadable record: " + why}
		d.log.Error("device lost", "device", id, "reason", why)
	}
	named := namedFiles(recs)
	for _, r := range recs {
		if !d.ids.reserve(r.ID) {
			d.log.Error("device ignored: id out of range or duplicate", "device", r.ID, "max", d.opts.MaxDevices)
			continue
		}
		d.devices[r.ID] = d.recoverDevice(r, named)
	}
	d.sweepRunDir()
	d.sweepStateDir()
	if err := d.loadPool(); err != nil {
		// The pool is an optimisation: a bad config file must not stop the daemon.
		d.log.Error("warm pool config ignored", "err", err)
	}
	return nil
}

// namedFiles says whether any of the records names a file as a layer or
// as its source or served config.
func namedFiles(recs []*record) func(path string) bool {
	set := map[string]bool{}
	for _, r := range recs {
		for _, p := range append([]string{r.Image, r.Config}, r.Layers...) {
			set[filepath.Clean(p)] = true
		}
	}
	return func(p string) bool { return set[filepath.Clean(p)] }
}

// namedNow is namedFiles of the devices the daemon holds now.
func (d *Daemon) namedNow(path string) bool {
	d.mu.Lock()
	devs := make([]*device, 0, len(d.devices))
	for _, dv := range d.devices {
		devs = append(devs, dv)
	}
	d.mu.Unlock()
	recs := make([]*record, 0, len(devs))
	for _, dv := range devs {
		dv.mu.RLock()
		r := dv.rec
		dv.mu.RUnlock()
		recs = append(recs, &r)
	}
	return namedFiles(recs)(path)
}

// recoverDevice settles one device's directory and re-exports it.
func (d *Daemon) recoverDevice(r *record, named func(path string) bool) *device {
	dv := &device{rec: *r}
	dir := d.deviceDir(r.ID)
	if how, err := recoverRestack(dir, r, named); err != nil {
		dv.lost = "restack recovery: " + err.Error()
	} else if how != "" {
		d.log.Info("interrupted restack "+how, "device", r.ID, "gen", r.Gen)
	}
	if dv.lost == "" {
		d.sweepDevice(dir, r)
		if why := checkStamps(r.Stamps); why != "" {
			dv.lost = why
		} else if err := d.start(dv); err != nil {
			dv.lost = err.Error()
		} else if !sameUblk(r.UblkID, dv.rec.UblkID) {
			// A new ublk device replaced one the kernel no longer had.
			if err := d.save(&dv.rec); err != nil {
				d.log.Error("save device after a new ublk device", "device", r.ID, "err", err)
			}
		}
	}
	if dv.lost != "" {
		d.log.Error("device lost", "device", r.ID, "reason", dv.lost)
		return dv
	}
	switch r.Kind {
	case rpc.KindShared:
		d.shared[r.Image] = r.ID
	case rpc.KindPool:
		d.pool.adopt(r.ID, shapeOf(r))
	}
	d.log.Info("device re-exported", "device", r.ID, "kind", r.Kind, "socket", d.socketPath(r.ID))
	return dv
}

// ownedFiles lists the files of a device directory its record names.
func ownedFiles(dir string, r *record) []string {
	data, index := genUpper(r.Gen)
	// The upper's pending journal holds the mappings of writes the last
	// daemon answered but did not flush: its open replays them.
	owned := []string{filepath.Join(dir, "device.json"), filepath.Join(dir, data), filepath.Join(dir, index),
		lsmt.JournalPath(filepath.Join(dir, index))}
	if r.Kind != rpc.KindShared {
		owned = append(owned, r.Config)
	}
	return append(owned, r.Layers...)
}

// sweepDevice removes what the record of dir does not name.
func (d *Daemon) sweepDevice(dir string, r *record) {
	owned := ownedFiles(dir, r)
	for _, sub := range []string{dir, filepath.Join(dir, "layers")} {
		entries, err := os.ReadDir(sub)
		if err != nil {
			continue
		}
		for _, e := range entries {
			p := filepath.Join(sub, e.Name())
			if (e.IsDir() && p == filepath.Join(dir, "layers")) || slices.Contains(owned, p) {
				continue
			}
			if err := os.RemoveAll(p); err != nil {
				d.log.Warn("remove unowned file", "device", r.ID, "path", p, "err", err)
				continue
			}
			d.log.Info("removed unowned file", "device", r.ID, "path", p)
		}
	}
}

var exportSocket = regexp.MustCompile(`^nbd-([0-9]+)\.sock$`)

// sweepRunDir removes export sockets no live device serves.
func (d *Daemon) sweepRunDir() {
	entries, err := os.ReadDir(d.opts.RunDir)
	if err != nil {
		return
	}
	for _, e := range entries {
		m := exportSocket.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		id, err := strconv.ParseUint(m[1], 10, 32)
		if err != nil {
			continue
		}
		if dv, ok := d.devices[uint32(id)]; ok && dv.lost == "" && dv.exp != nil {
			continue
		}
		p := filepath.Join(d.opts.RunDir, e.Name())
		if err := os.Remove(p); err == nil {
			d.log.Info("removed stale export socket", "path", p)
		}
	}
}

// sweepStateDir removes temporaries of atomic writes cut short at the top
// of the state directory (pool.json's).
func (d *Daemon) sweepStateDir() {
	entries, err := os.ReadDir(d.opts.StateDir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if e.IsDir() || !strings.HasPrefix(e.Name(), ".") || !strings.Contains(e.Name(), ".tmp-") {
			continue
		}
		p := filepath.Join(d.opts.StateDir, e.Name())
		if err := os.Remove(p); err == nil {
			d.log.Info("removed unowned file", "path", p)
		}
	}
}

func sameUblk(a, b *uint32) bool {
	return (a == nil && b == nil) || (a != nil && b != nil && *a == *b)
}
