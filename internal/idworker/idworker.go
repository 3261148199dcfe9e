// Package idworker makes globally unique, time-ordered 63-bit order IDs.
//
// An auto-increment column would leak sales volume and cannot be shared by
// several databases, and random UUIDs are not ordered. Instead an ID is
//
//	0 | 31 bits: seconds since 2022-01-01T00:00:00Z | 32 bits: sequence
//
// where the sequence is a Redis counter on a key per prefix and UTC day,
// icr:{prefix}:{yyyy:MM:dd}: the course's 全局唯一ID. The course calls INCR
// once per ID; here numbers are reserved a block at a time, by one INCRBY
// in next_n.lua (NextN; a Pool reserves Block, 128, and hands them out
// from memory: pool.go). INCRBY is atomic, so every instance that shares
// one Redis gets distinct numbers; the timestamp in the high bits makes
// IDs grow with time, and a new key each day keeps the counter far from
// its 32-bit limit (4,294,967,295 IDs a day).
//
// Redis may lose the day's key: a restart without persistence, a flush.
// A plain INCR or INCRBY would then start again from 0 and hand out, within
// the same second, IDs already given to orders. So nothing here ever
// creates a sequence by counting (next_n.lua refuses a missing key): a
// missing key is seeded by Seed, above the highest sequence number that
// the caller's Floor finds in use (the orders in MySQL and those waiting
// in Redis), and only then counted on. A key that survives with a stale
// value (a failover to a replica that missed the last INCRBYs) is not
// detected here.
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

// ErrSequenceMissing means the day's sequence key does not exist: Seed it,
// then draw again.
var ErrSequenceMissing = errors.New("idworker: the day's sequence is missing")

// Floor returns the highest sequence number used by an existing ID of
// prefix in [from, to): the IDs of one day. Seed starts a missing sequence
// above it.
type Floor func(ctx context.Context, prefix string, from, to int64) (int64, error)

// Worker hands out IDs. It is safe for concurrent use.
type Worker struct {
	rdb   redis.Cmdable
	now   func() time.Time
	floor Floor
}

// New returns a Worker that counts in rdb, reads the time from now, and
// seeds a missing day's sequence above floor's answer (nil: from zero, for
// IDs that are never stored).
func New(rdb redis.Cmdable, now func() time.Time, floor Floor) *Worker {
	return &Worker{rdb: rdb, now: now, floor: floor}
}

// SeedGap is how far above the floor Seed starts a sequence whose IDs are
// stored. The floor sees only the IDs that reached storage; numbers that
// Pools reserved and have not handed out yet, and IDs on their way to
// storage, are above it. If Redis lost the key while they were out,
// starting right at the floor would give them out twice. The gap must
// exceed all of those across every instance: 16,777,216 is 128 instances
// with 1,024 requests in flight and a block of 128 reserved, 64 times over,
// and costs 0.4% of a day's 32 bits, once per lost key.
const SeedGap = 1 << 24

// sequenceTTL keeps a day's key a day past its day: long enough for any
// request of that day to finish, short enough that old days go away.
const sequenceTTL = 48 * time.Hour

// Seed creates prefix's sequence for the UTC day of t if it is missing,
// starting it at the floor: the highest sequence number of that day in
// use. Several instances may seed at once; SET NX keeps the first, and
// every one of them started at or above the floor.
func (w *Worker) Seed(ctx context.Context, prefix string, t time.Time) error {
	if n, err := w.rdb.Exists(ctx, Key(prefix, t)).Result(); err != nil || n == 1 {
		return wrapSeed(prefix, t, err) // seeded already: spare the floor's query
	}
	day := t.UTC().Truncate(24 * time.Hour)
	var start int64
	if w.floor != nil {
		from, to := (day.Unix()-Epoch.Unix())<<sequenceBits, (day.Add(24*time.Hour).Unix()-Epoch.Unix())<<sequenceBits
		f, err := w.floor(ctx, prefix, max(from, 0), to)
		if err != nil {
			return wrapSeed(prefix, t, err)
		}
		start = min(f+SeedGap, maxSequence)
	}
	return wrapSeed(prefix, t, w.rdb.SetNX(ctx, Key(prefix, t), start, sequenceTTL).Err())
}

func wrapSeed(prefix string, t time.Time, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("idworker: seed %s: %w", Key(prefix, t), err)
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
	secs, err := seconds(now)
	if err != nil {
		return nil, err
	}
	var first, last int64
	for attempt := 0; ; attempt++ {
		first, last, err = w.reserve(ctx, prefix, now, n)
		if !errors.Is(err, ErrSequenceMissing) {
			break
		}
		if attempt == 2 {
			return nil, fmt.Errorf("%w: %s still missing after seeding", ErrSequenceMissing, Key(prefix, now))
		}
		if err := w.Seed(ctx, prefix, now); err != nil {
			return nil, err
		}
	}
	if err != nil {
		return nil, err
	}
	if last-first+1 < int64(n) {
		return nil, exhausted(prefix, now)
	}
	ids := make([]int64, n)
	for i := range ids {
		ids[i] = secs<<sequenceBits | (first + int64(i))
	}
	return ids, nil
}

// reserve takes up to n sequence numbers of prefix's sequence for the day
// of t with one INCRBY, and returns the first and last of them: fewer than
// n when the day's 32 bits run out on the way, ErrSequenceExhausted when
// none are left, ErrSequenceMissing when the key does not exist (see Seed).
func (w *Worker) reserve(ctx context.Context, prefix string, t time.Time, n int) (first, last int64, err error) {
	last, err = nextNScript.Run(ctx, w.rdb, []string{Key(prefix, t)}, n).Int64()
	switch {
	case err != nil:
		return 0, 0, fmt.Errorf("idworker: incr %s: %w", Key(prefix, t), err)
	case last < 0:
		return 0, 0, fmt.Errorf("%w: %s", ErrSequenceMissing, Key(prefix, t))
	}
	first = last - int64(n) + 1
	if first > maxSequence {
		return 0, 0, exhausted(prefix, t)
	}
	return first, min(last, maxSequence), nil
}

func exhausted(prefix string, t time.Time) error {
	return fmt.Errorf("%w (prefix %q, %s)", ErrSequenceExhausted, prefix, t.UTC().Format("2006-01-02"))
}

// seconds is the time part of an ID made at t.
func seconds(t time.Time) (int64, error) {
	secs := t.Unix() - Epoch.Unix()
	if secs < 0 || secs > maxSeconds {
		return 0, fmt.Errorf("idworker: time %s is outside the 31-bit range from %s", t.UTC().Format(time.RFC3339), Epoch.Format(time.RFC3339))
	}
	return secs, nil
}

var (
	//go:embed next_n.lua
	nextNSrc    string
	nextNScript = redis.NewScript(nextNSrc)
)

// FromScript reads an ID that a script returned (as a decimal string:
// Lua numbers are doubles and cannot hold 63 bits).
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
