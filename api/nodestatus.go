package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/agentenv/agentenv/api/wire"
	"github.com/agentenv/agentenv/internal/atomicfile"
)

// nodeStatusFile is the file in Options.StateDir that keeps the node's
// status across restarts: an operator's drain lasts until the operator
// undoes it, not until aenvd restarts.
const nodeStatusFile = "node-status.json"

// maxNodeStatusFile bounds the read of the file: it holds one short field.
const maxNodeStatusFile = 4 << 10

type nodeStatusRecord struct {
	Status wire.NodeStatusChangeStatus `json:"status"`
}

// loadDraining reads the node's persisted status from dir; no file is
// ready (a node never drained).
func loadDraining(dir string) (bool, error) {
	path := filepath.Join(dir, nodeStatusFile)
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read node status %s: %w", path, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxNodeStatusFile+1))
	if err != nil {
		return false, fmt.Errorf("read node status %s: %w", path, err)
	}
	if len(b) > maxNodeStatusFile {
		return false, fmt.Errorf("read node status %s: larger than %d bytes", path, maxNodeStatusFile)
	}
	var rec nodeStatusRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return false, fmt.Errorf("parse node status %s: %w", path, err)
	}
	switch rec.Status {
	case wire.NodeStatusChangeStatusDraining:
		return true, nil
	case wire.NodeStatusChangeStatusReady:
		return false, nil
	default:
		return false, fmt.Errorf("parse node status %s: status %q is not ready or draining", path, rec.Status)
	}
}

// saveDraining replaces the persisted status in dir; an empty dir keeps
// the status in memory only.
func saveDraining(dir string, status wire.NodeStatusChangeStatus) error {
	if dir == "" {
		return nil
	}
	b, err := json.Marshal(nodeStatusRecord{Status: status})
	if err != nil {
		return fmt.Errorf("encode node status: %w", err)
	}
	path := filepath.Join(dir, nodeStatusFile)
	if err := atomicfile.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("write node status %s: %w", path, err)
	}
	return nil
}

// initDraining sets the status the node starts with from Options.StateDir.
// A file that cannot be read leaves the node draining: it was written by an
// operator's status change, and putting a node back into service is for
// the operator to decide (POST /nodes/{id} {status: ready} replaces it).
func (s *Server) initDraining() {
	if s.opts.StateDir == "" {
		return
	}
	draining, err := loadDraining(s.opts.StateDir)
	if err != nil {
		s.log.Error("node status unreadable: the node starts draining", "err", err)
		draining = true
	}
	if draining {
		s.log.Info("node starts draining (its persisted status)")
	}
	s.draining.Store(draining)
}
