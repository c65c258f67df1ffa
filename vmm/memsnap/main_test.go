package memsnap

import (
	"os"
	"testing"

	"github.com/agentenv/agentenv/vmm/memsnap/memsnaptest"
)

func TestMain(m *testing.M) {
	memsnaptest.Main() // a helper process never returns from here
	os.Exit(m.Run())
}
