// Package failpoint injects faults at named points of AgentENV's processes,
// so tests can crash, fail or slow a process exactly between two steps of a
// state transition and then check that recovery finishes or undoes it.
//
// Points are declared by the packages that own them (New at package level)
// and armed through the environment when the process starts:
//
//	AENV_FAILPOINTS="orchestrator/pause/after-stop=crash;storaged/restack/after-seal=error"
//
// Actions: crash (SIGKILL of the own process: nothing runs after it, like a
// power cut of the process), error (Inject returns ErrInjected), delay:DUR
// (sleep, e.g. delay:2s). An action may carry @N to fire only on the N-th
// hit of the point (crash@2). An armed name that no package declares is
// reported by Check, so a misspelt point fails a test instead of silently
// never firing.
//
// Unarmed points cost one atomic load.
package failpoint

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// EnvVar names the environment variable that arms points.
const EnvVar = "AENV_FAILPOINTS"

// ErrInjected is returned by Inject at a point armed with "error".
var ErrInjected = errors.New("failpoint: injected error")

// Point is one named place in the code where a fault can be injected.
type Point struct {
	name  string
	armed atomic.Pointer[action]
	hits  atomic.Int64
}

type action struct {
	kind  string // crash, error, delay
	delay time.Duration
	nth   int64 // fire on this hit only; 0: every hit
}

var (
	mu       sync.Mutex // guards registry and the parsed environment
	registry = map[string]*Point{}
	env      map[string]*action
	envErr   error
)

// New declares a point; call it once per name, at package level.
func New(name string) *Point {
	mu.Lock()
	defer mu.Unlock()
	if _, dup := registry[name]; dup {
		panic("failpoint: duplicate point " + name)
	}
	loadEnvLocked()
	p := &Point{name: name}
	if a, ok := env[name]; ok {
		p.armed.Store(a)
	}
	registry[name] = p
	return p
}

// Name returns the point's name.
func (p *Point) Name() string { return p.name }

// Inject runs the point's action: nil when it is not armed (or not on this
// hit), ErrInjected for "error"; "crash" does not return.
func (p *Point) Inject() error {
	a := p.armed.Load()
	if a == nil {
		return nil
	}
	if n := p.hits.Add(1); a.nth != 0 && n != a.nth {
		return nil
	}
	switch a.kind {
	case "crash":
		fmt.Fprintf(os.Stderr, "failpoint %s: crash\n", p.name)
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	case "error":
		return fmt.Errorf("%s: %w", p.name, ErrInjected)
	case "delay":
		time.Sleep(a.delay)
	}
	return nil
}

// Arm sets a point's action in this process (tests of one process).
// spec is an action as in the environment; "" disarms.
func Arm(name, spec string) error {
	mu.Lock()
	p, ok := registry[name]
	mu.Unlock()
	if !ok {
		return fmt.Errorf("failpoint %q: not declared", name)
	}
	if spec == "" {
		p.armed.Store(nil)
		return nil
	}
	a, err := parseAction(spec)
	if err != nil {
		return fmt.Errorf("failpoint %q: %w", name, err)
	}
	p.hits.Store(0)
	p.armed.Store(a)
	return nil
}

// Names lists every declared point whose name starts with prefix, sorted.
func Names(prefix string) []string {
	mu.Lock()
	defer mu.Unlock()
	var out []string
	for n := range registry {
		if strings.HasPrefix(n, prefix) {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// Check reports a malformed environment or an armed name that no package
// declared. Processes call it once at startup, after their packages loaded.
func Check() error {
	mu.Lock()
	defer mu.Unlock()
	loadEnvLocked()
	if envErr != nil {
		return envErr
	}
	var unknown []string
	for n := range env {
		if _, ok := registry[n]; !ok {
			unknown = append(unknown, n)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return fmt.Errorf("%s: undeclared failpoints %s", EnvVar, strings.Join(unknown, ", "))
	}
	return nil
}

// Armed lists the armed points as name=action (for a startup log line).
func Armed() []string {
	mu.Lock()
	defer mu.Unlock()
	var out []string
	for n, p := range registry {
		if a := p.armed.Load(); a != nil {
			out = append(out, n+"="+a.kind)
		}
	}
	sort.Strings(out)
	return out
}

func loadEnvLocked() {
	if env != nil {
		return
	}
	env, envErr = parse(os.Getenv(EnvVar))
}

// parse reads a list of name=action pairs separated by ';'.
func parse(s string) (map[string]*action, error) {
	out := map[string]*action{}
	for _, item := range strings.Split(s, ";") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, spec, ok := strings.Cut(item, "=")
		if !ok || name == "" {
			return out, fmt.Errorf("%s: %q is not name=action", EnvVar, item)
		}
		a, err := parseAction(spec)
		if err != nil {
			return out, fmt.Errorf("%s: %s: %w", EnvVar, name, err)
		}
		out[name] = a
	}
	return out, nil
}

func parseAction(spec string) (*action, error) {
	a := &action{}
	if s, nth, ok := strings.Cut(spec, "@"); ok {
		n, err := strconv.ParseInt(nth, 10, 64)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bad hit count %q", nth)
		}
		spec, a.nth = s, n
	}
	kind, arg, _ := strings.Cut(spec, ":")
	switch kind {
	case "crash", "error":
		if arg != "" {
			return nil, fmt.Errorf("action %q takes no argument", kind)
		}
	case "delay":
		d, err := time.ParseDuration(arg)
		if err != nil || d < 0 {
			return nil, fmt.Errorf("bad delay %q", arg)
		}
		a.delay = d
	default:
		return nil, fmt.Errorf("unknown action %q (crash, error, delay:DUR)", kind)
	}
	a.kind = kind
	return a, nil
}
