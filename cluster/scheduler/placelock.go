package scheduler

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Placement reads every node and then reserves on one; two placements that
// read at once would see the same counts and pick the same node (a burst
// of creates then piles up). A short Redis lock shared by every replica
// makes read-choose-reserve one step. It expires by itself (placeLockTTL)
// when a replica dies holding it.
const (
	placeLockTTL  = 2 * time.Second
	placeLockWait = 5 * time.Second
)

// unlockScript deletes the lock if the caller still holds it. KEYS: lock.
// ARGV: token.
var unlockScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`)

func (k keys) placeLock() string { return k.p + "placelock" }

// lockPlacement waits for the placement lock; unlock releases it.
func (s *Scheduler) lockPlacement(ctx context.Context) (unlock func(), err error) {
	var b [12]byte
	_, _ = rand.Read(b[:])
	tok := hex.EncodeToString(b[:])
	deadline := time.Now().Add(placeLockWait)
	for wait := 200 * time.Microsecond; ; wait = min(2*wait, 20*time.Millisecond) {
		ok, err := s.rdb.SetNX(ctx, s.k.placeLock(), tok, placeLockTTL).Result()
		if err != nil {
			return nil, fmt.Errorf("placement lock: %w", err)
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("placement lock: still held after %s", placeLockWait)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("placement lock: %w", ctx.Err())
		case <-time.After(wait):
		}
	}
	return func() {
		if err := unlockScript.Run(context.WithoutCancel(ctx), s.rdb, []string{s.k.placeLock()}, tok).Err(); err != nil {
			s.log.Warn("release the placement lock", "err", err)
		}
	}, nil
}
