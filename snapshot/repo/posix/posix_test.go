package posix_test

import (
	"testing"

	"github.com/agentenv/agentenv/snapshot/repo"
	"github.com/agentenv/agentenv/snapshot/repo/posix"
	"github.com/agentenv/agentenv/snapshot/repo/repotest"
)

func TestConformance(t *testing.T) {
	repotest.Run(t, func(t *testing.T) repo.Backend {
		b, err := posix.NewBackend(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return b
	})
}
