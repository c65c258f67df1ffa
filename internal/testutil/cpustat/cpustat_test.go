package cpustat

import (
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	// user nice system idle iowait irq softirq steal guest guest_nice
	got, err := parse("cpu  100 20 30 5000 70 4 6 9 50 1\ncpu0 1 2 3\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := 160 * time.Second / userHZ; got != want {
		t.Fatalf("busy %v, want %v (idle, iowait, steal and guest left out)", got, want)
	}
	if _, err := parse("intr 1 2 3\n"); err == nil {
		t.Fatal("a file without the cpu line parsed")
	}
	if _, err := parse("cpu  1 x 3 4 5 6 7 8\n"); err == nil {
		t.Fatal("a non-numeric field parsed")
	}
}

func TestBusyGrows(t *testing.T) {
	a, err := Busy()
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
	}
	b, err := Busy()
	if err != nil {
		t.Fatal(err)
	}
	if b <= a {
		t.Fatalf("busy time %v then %v after 300 ms of spinning", a, b)
	}
}
