package idworker_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/idworker"
	"seckill/internal/testenv"
)

// The Redis these tests use is shared with other packages' tests, so each
// test counts under a prefix of its own and deletes its keys afterwards.

// clock is a settable time source for Worker.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// newWorker returns a Worker on the test Redis reading time from a clock
// set at t, a fresh prefix, and the client. Keys the test names through
// track are deleted when it ends.
func newWorker(t *testing.T, at time.Time) (*idworker.Worker, *clock, string, *redis.Client) {
	t.Helper()
	rdb := testenv.Redis(t, 0)
	c := &clock{t: at}
	return idworker.New(rdb, c.now, nil), c, testenv.Name("idworker-test-"), rdb
}

// track deletes keys when the test ends.
func track(t *testing.T, rdb *redis.Client, keys ...string) {
	t.Helper()
	t.Cleanup(func() { rdb.Del(context.Background(), keys...) })
}

func secondsSinceEpoch(t time.Time) int64 { return t.Unix() - idworker.Epoch.Unix() }

func TestNextLayout(t *testing.T) {
	ctx := context.Background()
	at := time.Date(2024, 3, 5, 12, 34, 56, 789_000_000, time.UTC)
	w, _, prefix, rdb := newWorker(t, at)
	key := "icr:" + prefix + ":2024:03:05"
	track(t, rdb, key)

	if got := idworker.Key(prefix, at); got != key {
		t.Fatalf("Key = %q, want %q", got, key)
	}
	for seq := int64(1); seq <= 3; seq++ {
		id, err := w.Next(ctx, prefix)
		if err != nil {
			t.Fatal(err)
		}
		if id <= 0 {
			t.Fatalf("id %d is not positive", id)
		}
		if got, want := id>>32, secondsSinceEpoch(at); got != want {
			t.Errorf("id>>32 = %d, want %d seconds since 2022-01-01", got, want)
		}
		if got := id & 0xFFFFFFFF; got != seq {
			t.Errorf("low 32 bits = %d, want sequence %d", got, seq)
		}
		ts, s := idworker.Parts(id)
		if !ts.Equal(at.Truncate(time.Second)) || s != seq {
			t.Errorf("Parts(%d) = %s, %d; want %s, %d", id, ts, s, at.Truncate(time.Second), seq)
		}
	}
	n, err := rdb.Get(ctx, key).Int64()
	if err != nil {
		t.Fatalf("GET %s: %v", key, err)
	}
	if n != 3 {
		t.Errorf("%s = %d, want 3", key, n)
	}
}

func TestKeyIsPerUTCDay(t *testing.T) {
	shanghai := time.FixedZone("UTC+8", 8*3600)
	tests := []struct {
		name string
		at   time.Time
		want string
	}{
		{"utc", time.Date(2024, 3, 5, 12, 0, 0, 0, time.UTC), "2024:03:05"},
		{"last second of the day", time.Date(2024, 3, 5, 23, 59, 59, 999_999_999, time.UTC), "2024:03:05"},
		{"first second of the next day", time.Date(2024, 3, 6, 0, 0, 0, 0, time.UTC), "2024:03:06"},
		// 07:00 on the 6th in Shanghai is still the 5th in UTC.
		{"other zone uses the UTC date", time.Date(2024, 3, 6, 7, 0, 0, 0, shanghai), "2024:03:05"},
		{"year end", time.Date(2024, 12, 31, 23, 59, 59, 0, time.UTC), "2024:12:31"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got, want := idworker.Key("order", tt.at), "icr:order:"+tt.want; got != want {
				t.Errorf("Key = %q, want %q", got, want)
			}
		})
	}
}

func TestSequenceRestartsAtMidnightUTC(t *testing.T) {
	ctx := context.Background()
	before := time.Date(2024, 3, 5, 23, 59, 59, 0, time.UTC)
	after := time.Date(2024, 3, 6, 0, 0, 0, 0, time.UTC)
	w, c, prefix, rdb := newWorker(t, before)
	dayOne, dayTwo := "icr:"+prefix+":2024:03:05", "icr:"+prefix+":2024:03:06"
	track(t, rdb, dayOne, dayTwo)

	var last int64
	for i := range 3 {
		id, err := w.Next(ctx, prefix)
		if err != nil {
			t.Fatal(err)
		}
		if _, seq := idworker.Parts(id); seq != int64(i+1) {
			t.Fatalf("day one: sequence %d, want %d", seq, i+1)
		}
		last = id
	}
	c.set(after)
	id, err := w.Next(ctx, prefix)
	if err != nil {
		t.Fatal(err)
	}
	if ts, seq := idworker.Parts(id); seq != 1 || !ts.Equal(after) {
		t.Errorf("first ID of day two: %s, sequence %d; want %s, 1", ts, seq, after)
	}
	if id <= last {
		t.Errorf("first ID of day two %d is not above the last of day one %d", id, last)
	}
	for key, want := range map[string]int64{dayOne: 3, dayTwo: 1} {
		if n, err := rdb.Get(ctx, key).Int64(); err != nil || n != want {
			t.Errorf("%s = %d (%v), want %d", key, n, err, want)
		}
	}
}

func TestNextN(t *testing.T) {
	ctx := context.Background()
	at := time.Date(2025, 7, 1, 8, 0, 0, 0, time.UTC)
	w, _, prefix, rdb := newWorker(t, at)
	track(t, rdb, idworker.Key(prefix, at))

	first, err := w.Next(ctx, prefix)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := w.NextN(ctx, prefix, 5)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 5 {
		t.Fatalf("NextN(5) returned %d IDs", len(ids))
	}
	for i, id := range ids {
		if want := first + 1 + int64(i); id != want {
			t.Errorf("ids[%d] = %d, want %d (consecutive after %d)", i, id, want, first)
		}
	}
	next, err := w.Next(ctx, prefix)
	if err != nil {
		t.Fatal(err)
	}
	if next != ids[4]+1 {
		t.Errorf("Next after NextN = %d, want %d", next, ids[4]+1)
	}

	for _, n := range []int{0, -1} {
		if ids, err := w.NextN(ctx, prefix, n); err == nil {
			t.Errorf("NextN(%d) = %v, nil; want an error", n, ids)
		}
	}
}

func TestIDsGrowWithTime(t *testing.T) {
	ctx := context.Background()
	at := time.Date(2023, 6, 1, 23, 59, 50, 0, time.UTC)
	w, c, prefix, rdb := newWorker(t, at)
	// The loop crosses midnight, so two days' keys.
	track(t, rdb, idworker.Key(prefix, at), idworker.Key(prefix, at.Add(time.Minute)))

	var prev int64
	for i := range 40 {
		if i%2 == 0 {
			c.set(at.Add(time.Duration(i) * time.Second))
		}
		id, err := w.Next(ctx, prefix)
		if err != nil {
			t.Fatal(err)
		}
		if id <= prev {
			t.Fatalf("call %d: id %d is not above the previous %d", i, id, prev)
		}
		prev = id
	}
}

func TestNextIsUniqueUnderConcurrency(t *testing.T) {
	ctx := context.Background()
	at := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	rdb := testenv.Redis(t, 0)
	prefix := testenv.Name("idworker-test-")
	track(t, rdb, idworker.Key(prefix, at))

	const workers, each = 8, 50
	ids := make(chan int64, workers*each)
	errs := make(chan error, workers*each)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range workers {
		// A Worker per goroutine, as if each were its own instance.
		w := idworker.New(rdb, func() time.Time { return at }, nil)
		wg.Go(func() {
			<-start
			for range each {
				id, err := w.Next(ctx, prefix)
				if err != nil {
					errs <- err
					return
				}
				ids <- id
			}
		})
	}
	close(start)
	wg.Wait()
	close(ids)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	seen := map[int64]bool{}
	for id := range ids {
		if seen[id] {
			t.Fatalf("id %d handed out twice", id)
		}
		seen[id] = true
	}
	if len(seen) != workers*each {
		t.Fatalf("%d distinct IDs, want %d", len(seen), workers*each)
	}
}

func TestSequenceExhausted(t *testing.T) {
	at := time.Date(2024, 2, 29, 10, 0, 0, 0, time.UTC)
	const maxSeq = 1<<32 - 1
	tests := []struct {
		name    string
		current int64 // the key's value before the call
		n       int
		wantSeq int64 // 0: want ErrSequenceExhausted
	}{
		{"last sequence is handed out", maxSeq - 1, 1, maxSeq},
		{"past the last sequence", maxSeq, 1, 0},
		{"a batch crossing the limit", maxSeq - 1, 2, 0},
		{"a batch ending on the limit", maxSeq - 2, 2, maxSeq},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			w, _, prefix, rdb := newWorker(t, at)
			key := idworker.Key(prefix, at)
			track(t, rdb, key)
			if err := rdb.Set(ctx, key, tt.current, 0).Err(); err != nil {
				t.Fatal(err)
			}
			ids, err := w.NextN(ctx, prefix, tt.n)
			if tt.wantSeq == 0 {
				if !errors.Is(err, idworker.ErrSequenceExhausted) {
					t.Fatalf("NextN = %v, %v; want an error wrapping ErrSequenceExhausted", ids, err)
				}
				if ids != nil {
					t.Errorf("NextN returned IDs %v with its error", ids)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, seq := idworker.Parts(ids[len(ids)-1]); seq != tt.wantSeq {
				t.Errorf("last sequence = %d, want %d", seq, tt.wantSeq)
			}
		})
	}

	t.Run("Next", func(t *testing.T) {
		ctx := context.Background()
		w, _, prefix, rdb := newWorker(t, at)
		key := idworker.Key(prefix, at)
		track(t, rdb, key)
		if err := rdb.Set(ctx, key, maxSeq, 0).Err(); err != nil {
			t.Fatal(err)
		}
		id, err := w.Next(ctx, prefix)
		if !errors.Is(err, idworker.ErrSequenceExhausted) {
			t.Fatalf("Next = %d, %v; want an error wrapping ErrSequenceExhausted", id, err)
		}
		if id != 0 {
			t.Errorf("Next returned ID %d with its error", id)
		}
	})
}

func TestPartsRoundTrip(t *testing.T) {
	tests := []struct {
		at  time.Time
		seq int64
	}{
		{idworker.Epoch, 1},
		{time.Date(2024, 3, 5, 12, 34, 56, 0, time.UTC), 42},
		{time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC), 1<<32 - 1},
		{idworker.Epoch.Add((1<<31 - 1) * time.Second), 7},
	}
	for _, tt := range tests {
		t.Run(tt.at.Format(time.RFC3339), func(t *testing.T) {
			id := secondsSinceEpoch(tt.at)<<32 | tt.seq
			if id <= 0 {
				t.Fatalf("id %d is not a positive 63-bit number", id)
			}
			ts, seq := idworker.Parts(id)
			if !ts.Equal(tt.at) || seq != tt.seq {
				t.Errorf("Parts(%d) = %s, %d; want %s, %d", id, ts, seq, tt.at, tt.seq)
			}
		})
	}
}

func TestClockOutOfRange(t *testing.T) {
	tests := []struct {
		name string
		at   time.Time
	}{
		{"before 2022", time.Date(2021, 12, 31, 23, 59, 59, 0, time.UTC)},
		{"zero time", time.Time{}},
		{"past 31 bits of seconds", idworker.Epoch.Add(1 << 31 * time.Second)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			w, _, prefix, rdb := newWorker(t, tt.at)
			key := idworker.Key(prefix, tt.at)
			track(t, rdb, key)
			id, err := w.Next(ctx, prefix)
			if err == nil {
				t.Fatalf("Next = %d, nil; want an error", id)
			}
			if id != 0 {
				t.Errorf("Next returned ID %d with its error", id)
			}
			// Nothing was counted for a time the ID cannot hold.
			if n, err := rdb.Exists(ctx, key).Result(); err != nil || n != 0 {
				t.Errorf("EXISTS %s = %d (%v), want 0", key, n, err)
			}
		})
	}
}

// Redis loses the day's sequence within the same second (a restart, a
// flush, a failover): IDs drawn afterwards must not repeat those given out
// before. Seed restarts the sequence above what the Floor finds in use; the
// floor here stands in for the orders in MySQL and the stream. Without
// seeding, INCR would restart at 1 and the first ID would repeat.
func TestLostSequenceNeverRepeats(t *testing.T) {
	ctx := context.Background()
	at := time.Date(2024, 3, 5, 12, 0, 0, 0, time.UTC)
	rdb := testenv.Redis(t, 0)
	prefix := testenv.Name("idworker-test-")
	track(t, rdb, idworker.Key(prefix, at))
	var mu sync.Mutex
	used := map[int64]bool{}
	var asked [][2]int64
	floor := func(_ context.Context, _ string, from, to int64) (int64, error) {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, [2]int64{from, to})
		var top int64
		for id := range used {
			if id >= from && id < to {
				top = max(top, id&(1<<32-1))
			}
		}
		return top, nil
	}
	w := idworker.New(rdb, func() time.Time { return at }, floor)
	draw := func() {
		id, err := w.Next(ctx, prefix)
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		if used[id] {
			t.Fatalf("ID %d given out twice", id)
		}
		used[id] = true
	}
	for range 5 {
		draw()
	}
	if err := rdb.Del(ctx, idworker.Key(prefix, at)).Err(); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		draw()
	}
	if len(used) != 10 {
		t.Fatalf("%d distinct IDs, want 10", len(used))
	}
	day := secondsSinceEpoch(time.Date(2024, 3, 5, 0, 0, 0, 0, time.UTC))
	if len(asked) != 2 || asked[1] != [2]int64{day << 32, (day + 86400) << 32} {
		t.Fatalf("floor asked %v, want twice, for the IDs of 2024-03-05", asked)
	}
	if ttl := rdb.TTL(ctx, idworker.Key(prefix, at)).Val(); ttl <= 0 || ttl > 48*time.Hour {
		t.Fatalf("sequence TTL %s: a day's key must expire", ttl)
	}
}
