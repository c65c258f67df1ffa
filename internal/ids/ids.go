// Package ids makes the random identifiers of the node's objects in the
// forms E2B's clients expect: 20 characters of [a-z0-9] for sandboxes,
// templates and snapshots, version 4 UUIDs for builds, hex for tokens.
package ids

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
)

const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

// New returns 20 characters of [a-z0-9], as E2B's sandbox ids.
func New() (string, error) {
	b := make([]byte, 20)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("new id: %w", err)
	}
	for i := range b {
		// 256 is not a multiple of 36: the first 4 characters are slightly
		// likelier; ids need to be unique, not uniform.
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b), nil
}

// UUID returns a random (version 4) UUID, E2B's form of build ids.
func UUID() (string, error) {
	var u [16]byte
	if _, err := rand.Read(u[:]); err != nil {
		return "", fmt.Errorf("new uuid: %w", err)
	}
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	h := hex.EncodeToString(u[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:], nil
}

// Hex returns n random bytes hex-encoded (tokens).
func Hex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("random token: %w", err)
	}
	return hex.EncodeToString(b), nil
}
