// Package state holds the agent's mutable settings — the access token, the
// environment variables, the default user and working directory set through
// POST /init — and answers the two questions every request asks of them:
// is this request authorised, and which user does it act as.
package state

import (
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/agentenv/agentenv/guest/agent/users"
)

// AccessTokenHeader carries the access token set by /init.
const AccessTokenHeader = "X-Access-Token"

// State is safe for concurrent use.
type State struct {
	Users *users.DB

	mu             sync.RWMutex
	token          string
	envs           map[string]string
	defaultUser    string
	defaultWorkdir string
}

// New returns a state without a token, with the given default user ("" means
// the user the agent runs as).
func New(db *users.DB, defaultUser string) *State {
	return &State{Users: db, defaultUser: defaultUser, envs: map[string]string{}}
}

// Settings is the part of /init that changes state; nil fields are left alone.
type Settings struct {
	AccessToken    *string
	EnvVars        map[string]string
	DefaultUser    *string
	DefaultWorkdir *string
}

// Apply merges s into the state.
func (st *State) Apply(s Settings) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if s.AccessToken != nil {
		st.token = *s.AccessToken
	}
	maps.Copy(st.envs, s.EnvVars)
	if s.DefaultUser != nil && *s.DefaultUser != "" {
		st.defaultUser = *s.DefaultUser
	}
	if s.DefaultWorkdir != nil && *s.DefaultWorkdir != "" {
		st.defaultWorkdir = *s.DefaultWorkdir
	}
}

// Token returns the access token ("" when none is set).
func (st *State) Token() string {
	st.mu.RLock()
	defer st.mu.RUnlock()
	return st.token
}

// Envs returns a copy of the global environment variables.
func (st *State) Envs() map[string]string {
	st.mu.RLock()
	defer st.mu.RUnlock()
	return maps.Clone(st.envs)
}

// DefaultWorkdir returns the workdir set by /init ("" when none).
func (st *State) DefaultWorkdir() string {
	st.mu.RLock()
	defer st.mu.RUnlock()
	return st.defaultWorkdir
}

// TokenOK reports whether the request may pass: no token is set, or the
// header carries it.
func (st *State) TokenOK(h http.Header) bool {
	tok := st.Token()
	if tok == "" {
		return true
	}
	return TokenEqual(h.Get(AccessTokenHeader), tok)
}

// TokenEqual compares in constant time.
func TokenEqual(got, want string) bool {
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// BasicUser extracts the user name of an `Authorization: Basic base64("user:")`
// header; ok is false when the header is absent or not Basic.
func BasicUser(h http.Header) (name string, ok bool, err error) {
	v := h.Get("Authorization")
	if v == "" {
		return "", false, nil
	}
	scheme, payload, found := strings.Cut(v, " ")
	if !found || !strings.EqualFold(scheme, "Basic") {
		return "", false, nil
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(payload))
	if err != nil {
		return "", false, fmt.Errorf("decode basic auth: %w", err)
	}
	name, _, _ = strings.Cut(string(raw), ":")
	return name, name != "", nil
}

// TemplateUser is the account E2B's templates (and ours) run everything as
// unless told otherwise; it is the default user wherever it exists.
const TemplateUser = "user"

// User resolves a user name; "" means the default user: the one configured
// (flag or /init), else TemplateUser when the guest has it, else the user the
// agent runs as.
func (st *State) User(name string) (*users.User, error) {
	if name == "" {
		st.mu.RLock()
		name = st.defaultUser
		st.mu.RUnlock()
	}
	if name != "" {
		return st.Users.Lookup(name)
	}
	if u, err := st.Users.Lookup(TemplateUser); err == nil {
		return u, nil
	}
	u, err := st.Users.LookupUID(uint32(os.Getuid()))
	if err != nil {
		// An agent running as an id without a passwd line still works, as itself.
		home, _ := os.UserHomeDir()
		return &users.User{Name: fmt.Sprint(os.Getuid()), UID: uint32(os.Getuid()), GID: uint32(os.Getgid()),
			Groups: []uint32{uint32(os.Getgid())}, Home: home}, nil
	}
	return u, nil
}

// RequestUser resolves the user a request acts as, from its Basic auth header.
func (st *State) RequestUser(h http.Header) (*users.User, error) {
	name, _, err := BasicUser(h)
	if err != nil {
		return nil, err
	}
	return st.User(name)
}

// ResolvePath makes p absolute: "~" and "~/x" expand to the user's home,
// relative paths resolve against the home too (E2B's SDKs rely on it).
func ResolvePath(u *users.User, p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("resolve path: empty path")
	}
	home := u.Home
	if home == "" {
		home = "/"
	}
	switch {
	case p == "~":
		p = home
	case strings.HasPrefix(p, "~/"):
		p = filepath.Join(home, p[2:])
	case !filepath.IsAbs(p):
		p = filepath.Join(home, p)
	}
	return filepath.Clean(p), nil
}
