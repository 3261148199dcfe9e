// Package idworker makes globally unique, time-ordered 63-bit order IDs.
//
// An auto-increment column would leak sales volume and cannot be shared by
// several databases, and random UUIDs are not ordered. Instead an ID is
//
//	0 | 31 bits: seconds since 2022-01-01T00:00:00Z | 32 bits: sequence
//
// where the sequence comes from Redis INCR on a key per prefix and UTC day,
// icr:{prefix}:{yyyy:MM:dd}. Redis INCR is atomic, so every instance that
// shares one Redis gets distinct sequences; the timestamp in the high bits
// makes IDs grow with time, and a new key each day keeps the counter far
// from its 32-bit limit (4,294,967,295 IDs a day) and doubles as a count of
// the day's orders.
package idworker

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Epoch is the zero of the timestamp part: 2022-01-01T00:00:00Z.
var Epoch = time.Date(2022, 1, 1, 0, 0, 0, 0, time.UTC)

const (
	sequenceBits = 32
	maxSequence  = 1<<sequenceBits - 1
	maxSeconds   = 1<<31 - 1
)

// ErrSequenceExhausted means a day's 32-bit sequence ran out. Wrapping the
// counter around would hand out IDs that were already used, so the worker
// refuses instead.
var ErrSequenceExhausted = errors.New("idworker: the day's sequence is exhausted")

// Worker hands out IDs. It is safe for concurrent use.
type Worker struct {
	rdb redis.Cmdable
	now func() time.Time
}

// New returns a Worker that counts in rdb and reads the time from now.
func New(rdb redis.Cmdable, now func() time.Time) *Worker {
	return &Worker{rdb: rdb, now: now}
}

// Key is the Redis key holding prefix's sequence for the UTC day of t.
func Key(prefix string, t time.Time) string {
	return "icr:" + prefix + ":" + t.UTC().Format("2006:01:02")
}

// Next returns a new ID for prefix (one Redis round trip).
func (w *Worker) Next(ctx context.Context, prefix string) (int64, error) {
	ids, err := w.NextN(ctx, prefix, 1)
	if err != nil {
		return 0, err
	}
	return ids[0], nil
}

// NextN returns n new IDs for prefix with a single INCRBY, for batches.
func (w *Worker) NextN(ctx context.Context, prefix string, n int) ([]int64, error) {
	if n <= 0 {
		return nil, fmt.Errorf("idworker: asked for %d IDs", n)
	}
	now := w.now()
	secs := now.Unix() - Epoch.Unix()
	if secs < 0 || secs > maxSeconds {
		return nil, fmt.Errorf("idworker: time %s is outside the 31-bit range from %s", now.UTC().Format(time.RFC3339), Epoch.Format(time.RFC3339))
	}
	last, err := w.rdb.IncrBy(ctx, Key(prefix, now), int64(n)).Result()
	if err != nil {
		return nil, fmt.Errorf("idworker: incr %s: %w", Key(prefix, now), err)
	}
	if last > maxSequence {
		return nil, fmt.Errorf("%w (prefix %q, %s)", ErrSequenceExhausted, prefix, now.UTC().Format("2006-01-02"))
	}
	ids := make([]int64, n)
	for i := range ids {
		seq := last - int64(n-1-i)
		ids[i] = secs<<sequenceBits | seq
	}
	return ids, nil
}

// Slot is what a Lua script needs to draw an ID itself (see LuaNextID):
// the day's sequence key, and the time part split in two decimal halves.
type Slot struct {
	Key    string
	Hi, Lo int64 // (seconds << 32) = Hi * 1e9 + Lo
}

// SlotAt returns the slot of prefix at time t.
func SlotAt(prefix string, t time.Time) (Slot, error) {
	secs := t.Unix() - Epoch.Unix()
	if secs < 0 || secs > maxSeconds {
		return Slot{}, fmt.Errorf("idworker: time %s is outside the 31-bit range from %s", t.UTC().Format(time.RFC3339), Epoch.Format(time.RFC3339))
	}
	base := secs << sequenceBits
	return Slot{Key: Key(prefix, t), Hi: base / 1e9, Lo: base % 1e9}, nil
}

// LuaNextID defines the Lua function next_id(seq_key, hi, lo), which draws
// an ID in this package's layout inside a script; prepend it to a script
// that allocates IDs in the same atomic step as its other work. It lets a
// request make one round trip instead of two.
//
//go:embed next_id.lua
var LuaNextID string

// FromScript reads an ID that next_id returned through a script's reply.
func FromScript(v any) (int64, error) {
	s, _ := v.(string)
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return 0, fmt.Errorf("idworker: malformed ID %v from a script", v)
	}
	return id, nil
}

// Parts splits id into the time it was made (to the second) and its
// sequence number.
func Parts(id int64) (time.Time, int64) {
	return Epoch.Add(time.Duration(id>>sequenceBits) * time.Second), id & maxSequence
}
