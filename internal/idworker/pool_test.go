package idworker_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"seckill/internal/idworker"
)

// Two pools, as two instances would hold, hand out IDs to many goroutines
// at once: every ID is distinct, made at the clock's second, and the
// sequence was asked once per block, not once per ID.
func TestPoolUniqueAcrossInstances(t *testing.T) {
	ctx := context.Background()
	at := time.Date(2024, 3, 5, 12, 0, 0, 0, time.UTC)
	w, _, prefix, rdb := newWorker(t, at)
	key := idworker.Key(prefix, at)
	track(t, rdb, key)
	if err := rdb.Set(ctx, key, 0, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	pools := []*idworker.Pool{w.NewPool(prefix, nil), w.NewPool(prefix, nil)}
	const workers, each = 32, 100
	ids := make(chan int64, workers*each)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range workers {
		p := pools[i%2]
		wg.Go(func() {
			<-start
			for range each {
				id, err := p.Next(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				ids <- id
			}
		})
	}
	close(start)
	wg.Wait()
	close(ids)
	seen := map[int64]bool{}
	for id := range ids {
		if seen[id] {
			t.Fatalf("ID %d handed out twice", id)
		}
		seen[id] = true
		if made, _ := idworker.Parts(id); !made.Equal(at) {
			t.Fatalf("ID %d made at %s, want %s", id, made, at)
		}
	}
	if len(seen) != workers*each {
		t.Fatalf("%d IDs, want %d", len(seen), workers*each)
	}
	// 3,200 IDs in blocks of 128: 25 blocks, and at most one more per pool
	// part-used.
	if n, err := rdb.Get(ctx, key).Int64(); err != nil || n > 27*idworker.Block {
		t.Fatalf("sequence at %d (%v) after 3,200 IDs: want at most 27 blocks of %d", n, err, idworker.Block)
	}
}

// An ID given back is handed out again, with the time of then; one of a
// past day is not, and a new day reserves from the new day's key.
func TestPoolReturnAndNewDay(t *testing.T) {
	ctx := context.Background()
	at := time.Date(2024, 3, 5, 23, 59, 58, 0, time.UTC)
	w, c, prefix, rdb := newWorker(t, at)
	next := at.Add(2 * time.Second)
	track(t, rdb, idworker.Key(prefix, at), idworker.Key(prefix, next))
	p := w.NewPool(prefix, nil)
	first, err := p.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, seq := idworker.Parts(first); seq != 1 {
		t.Fatalf("first ID's sequence %d, want 1 (seeded from nothing)", seq)
	}
	p.Return(first)
	c.set(at.Add(time.Second))
	again, err := p.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if made, seq := idworker.Parts(again); seq != 1 || !made.Equal(at.Add(time.Second)) {
		t.Fatalf("after Return: %s, sequence %d; want %s, 1", made, seq, at.Add(time.Second))
	}
	c.set(next)
	p.Return(again) // yesterday's: dropped
	day2, err := p.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if made, seq := idworker.Parts(day2); seq != 1 || !made.Equal(next) {
		t.Fatalf("new day: %s, sequence %d; want %s, 1", made, seq, next)
	}
	if n, _ := rdb.Get(ctx, idworker.Key(prefix, next)).Int64(); n != idworker.Block {
		t.Fatalf("new day's sequence at %d, want one block (%d)", n, idworker.Block)
	}
}

// A missing sequence is seeded through the pool's seed function, which the
// service uses to seed once for many callers; a stored sequence restarts
// SeedGap above its floor, past the numbers still out in pools.
func TestPoolSeedsMissingSequence(t *testing.T) {
	ctx := context.Background()
	at := time.Date(2024, 3, 5, 12, 0, 0, 0, time.UTC)
	_, _, prefix, rdb := newWorker(t, at)
	track(t, rdb, idworker.Key(prefix, at))
	floor := func(context.Context, string, int64, int64) (int64, error) { return 41, nil }
	w := idworker.New(rdb, func() time.Time { return at }, floor)
	var seeds int
	p := w.NewPool(prefix, func(ctx context.Context, t time.Time) error {
		seeds++
		return w.Seed(ctx, prefix, t)
	})
	id, err := p.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, seq := idworker.Parts(id); seq != 41+idworker.SeedGap+1 || seeds != 1 {
		t.Fatalf("sequence %d after %d seeds, want %d after 1", seq, seeds, 41+idworker.SeedGap+1)
	}
	broken := w.NewPool(prefix+"x", func(context.Context, time.Time) error { return nil })
	if _, err := broken.Next(ctx); !errors.Is(err, idworker.ErrSequenceMissing) {
		t.Fatalf("seed that seeds nothing: %v, want ErrSequenceMissing", err)
	}
}

// The end of a day's 32 bits: a pool hands out what is left, then refuses.
func TestPoolExhausted(t *testing.T) {
	ctx := context.Background()
	at := time.Date(2024, 3, 5, 12, 0, 0, 0, time.UTC)
	w, _, prefix, rdb := newWorker(t, at)
	key := idworker.Key(prefix, at)
	track(t, rdb, key)
	rdb.Set(ctx, key, int64(1<<32-3), time.Hour)
	p := w.NewPool(prefix, nil)
	for want := int64(1<<32 - 2); want <= 1<<32-1; want++ {
		id, err := p.Next(ctx)
		if _, seq := idworker.Parts(id); err != nil || seq != want {
			t.Fatalf("Next = sequence %d, %v; want %d", seq, err, want)
		}
	}
	if id, err := p.Next(ctx); !errors.Is(err, idworker.ErrSequenceExhausted) {
		t.Fatalf("Next = %d, %v; want ErrSequenceExhausted", id, err)
	}
}

// Numbers reserved more than MaxAge ago are dropped, not stamped with a
// much later second: order.IDFloor looks for the highest sequence number
// among the IDs of the last two minutes only.
func TestPoolDropsOldBlocks(t *testing.T) {
	ctx := context.Background()
	at := time.Date(2024, 3, 5, 12, 0, 0, 0, time.UTC)
	w, c, prefix, rdb := newWorker(t, at)
	track(t, rdb, idworker.Key(prefix, at))
	p := w.NewPool(prefix, nil)
	first, err := p.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c.set(at.Add(idworker.MaxAge + time.Second))
	later, err := p.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, s1 := idworker.Parts(first)
	if _, s2 := idworker.Parts(later); s2 != s1+idworker.Block {
		t.Fatalf("after MaxAge: sequence %d, want %d (a new block; the old one dropped)", s2, s1+idworker.Block)
	}
}
