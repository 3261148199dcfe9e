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
	"errors"
	"fmt"
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

// Compose makes the ID for sequence seq at time t, checking both ranges:
// for callers that take the sequence themselves (a Lua script that
// allocates it in the same step as the order, as async mode does).
func Compose(t time.Time, seq int64) (int64, error) {
	secs := t.Unix() - Epoch.Unix()
	if secs < 0 || secs > maxSeconds {
		return 0, fmt.Errorf("idworker: time %s is outside the 31-bit range from %s", t.UTC().Format(time.RFC3339), Epoch.Format(time.RFC3339))
	}
	if seq < 0 || seq > maxSequence {
		return 0, fmt.Errorf("%w (sequence %d)", ErrSequenceExhausted, seq)
	}
	return secs<<sequenceBits | seq, nil
}

// MaxSequence is the largest sequence number of a day.
const MaxSequence = maxSequence

// Parts splits id into the time it was made (to the second) and its
// sequence number.
func Parts(id int64) (time.Time, int64) {
	return Epoch.Add(time.Duration(id>>sequenceBits) * time.Second), id & maxSequence
}
