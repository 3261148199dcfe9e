package lock

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func rwName(t *testing.T, r *Redis) string {
	return testName(t, r.rdb, func(name string) []string { return rwKeysFor(name).list() })
}

// TestRWLockExclusion releases 40 readers and 8 writers at once, each
// taking the lock five times, and asserts that a writer never overlaps
// anybody, and that readers did overlap.
func TestRWLockExclusion(t *testing.T) {
	const readers, writers, rounds = 40, 8, 5
	r, _ := syncRedis(t)
	rw := r.RWLock(rwName(t, r))
	var reading, writing, mostReading atomic.Int64
	var overlap atomic.Bool
	start := make(chan struct{})
	errs := make(chan error, (readers+writers)*rounds)
	var wg sync.WaitGroup
	run := func(obtain func(context.Context, time.Duration, ...Option) (Lock, error), inside func()) {
		<-start
		for range rounds {
			lk, err := obtain(waitCtx(t, 30*time.Second), 10*time.Second, Wait())
			if err != nil {
				errs <- err
				return
			}
			inside()
			errs <- lk.Release(context.Background())
		}
	}
	for range readers {
		wg.Go(func() {
			run(rw.ObtainRead, func() {
				n := reading.Add(1)
				for m := mostReading.Load(); n > m && !mostReading.CompareAndSwap(m, n); m = mostReading.Load() {
				}
				if writing.Load() > 0 {
					overlap.Store(true)
				}
				time.Sleep(2 * time.Millisecond)
				if writing.Load() > 0 {
					overlap.Store(true)
				}
				reading.Add(-1)
			})
		})
	}
	for range writers {
		wg.Go(func() {
			run(rw.ObtainWrite, func() {
				if writing.Add(1) > 1 || reading.Load() > 0 {
					overlap.Store(true)
				}
				time.Sleep(time.Millisecond)
				if reading.Load() > 0 {
					overlap.Store(true)
				}
				writing.Add(-1)
			})
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if overlap.Load() {
		t.Error("a writer overlapped another holder")
	}
	if mostReading.Load() < 2 {
		t.Errorf("at most %d reader at once: readers never overlapped", mostReading.Load())
	}
}

// TestRWLockWriterNotStarved runs a stream of readers that always overlap,
// so the lock is never free of readers, and checks that a writer arriving
// in the middle gets the lock soon, not when the stream ends.
func TestRWLockWriterNotStarved(t *testing.T) {
	const stream, hold = 1500 * time.Millisecond, 30 * time.Millisecond
	r, _ := syncRedis(t)
	rw := r.RWLock(rwName(t, r))
	var writing atomic.Bool
	var overlap atomic.Bool
	stop := time.Now().Add(stream)
	errs := make(chan error, 1000)
	var wg sync.WaitGroup
	wg.Go(func() {
		for time.Now().Before(stop) {
			wg.Go(func() {
				lk, err := rw.ObtainRead(waitCtx(t, 10*time.Second), 10*time.Second, Wait())
				if err != nil {
					errs <- err
					return
				}
				if writing.Load() {
					overlap.Store(true)
				}
				time.Sleep(hold)
				errs <- lk.Release(context.Background())
			})
			time.Sleep(hold / 6)
		}
	})
	time.Sleep(stream / 5)
	asked := time.Now()
	lk, err := rw.ObtainWrite(waitCtx(t, 10*time.Second), 10*time.Second, Wait())
	if err != nil {
		t.Fatal(err)
	}
	waited := time.Since(asked)
	writing.Store(true)
	time.Sleep(hold)
	writing.Store(false)
	mustRelease(t, lk)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	// The readers inside when the writer came need one hold to finish;
	// without its priority the writer would wait for the stream to end.
	if waited > stream/3 {
		t.Errorf("the writer waited %v among readers holding %v each", waited, hold)
	}
	if overlap.Load() {
		t.Error("a reader overlapped the writer")
	}
}

func TestRWLock(t *testing.T) {
	ctx := context.Background()
	r, rdb := syncRedis(t)
	notAcquired := func(t *testing.T, what string, lk Lock, err error) {
		t.Helper()
		if err == nil {
			_ = lk.Release(ctx)
		}
		if err != ErrNotAcquired {
			t.Errorf("%s: got %v, want ErrNotAcquired", what, err)
		}
	}

	t.Run("Reentrant", func(t *testing.T) {
		rw := r.RWLock(rwName(t, r))
		a1 := must(t)(rw.ObtainRead(ctx, 10*time.Second, WithOwner("alice")))
		a2 := must(t)(rw.ObtainRead(ctx, 10*time.Second, WithOwner("alice")))
		c := must(t)(rw.ObtainRead(ctx, 10*time.Second)) // readers share
		lk, err := rw.ObtainWrite(ctx, time.Second, WithOwner("bob"))
		notAcquired(t, "write among readers", lk, err)
		mustRelease(t, a2)
		mustRelease(t, c)
		lk, err = rw.ObtainWrite(ctx, time.Second, WithOwner("bob"))
		notAcquired(t, "write while alice reads at depth 1", lk, err)
		lk, err = rw.ObtainWrite(ctx, time.Second, WithOwner("alice"))
		notAcquired(t, "a reader upgrading", lk, err)
		mustRelease(t, a1)

		b1 := must(t)(rw.ObtainWrite(ctx, 10*time.Second, WithOwner("bob")))
		b2 := must(t)(rw.ObtainWrite(ctx, 10*time.Second, WithOwner("bob")))
		b3 := must(t)(rw.ObtainRead(ctx, 10*time.Second, WithOwner("bob"))) // the writer may read
		lk, err = rw.ObtainRead(ctx, time.Second, WithOwner("alice"))
		notAcquired(t, "read while bob writes", lk, err)
		mustRelease(t, b2)
		mustRelease(t, b1)
		// Bob still reads: others may read too, nobody may write.
		mustRelease(t, must(t)(rw.ObtainRead(ctx, time.Second)))
		lk, err = rw.ObtainWrite(ctx, time.Second)
		notAcquired(t, "write while bob reads", lk, err)
		mustRelease(t, b3)
		mustRelease(t, must(t)(rw.ObtainWrite(ctx, time.Second)))
		if err := b3.Release(ctx); err != ErrNotHeld {
			t.Errorf("second Release: got %v, want ErrNotHeld", err)
		}
	})

	t.Run("WriterWakesReaders", func(t *testing.T) {
		rw := r.RWLock(rwName(t, r))
		w := must(t)(rw.ObtainWrite(ctx, 30*time.Second))
		const n = 5
		got := make(chan time.Time, n)
		for range n {
			go func() {
				lk, err := rw.ObtainRead(waitCtx(t, 10*time.Second), 10*time.Second, Wait())
				if err != nil {
					t.Error(err)
					got <- time.Time{}
					return
				}
				got <- time.Now()
				time.Sleep(50 * time.Millisecond) // all read at once
				_ = lk.Release(ctx)
			}()
		}
		waitSubscribed(t, r, n) // all asked, were turned away, and wait
		released := time.Now()
		mustRelease(t, w)
		for range n {
			// The writer's ttl is 30s and so is the poll: only the
			// release wakes them, all of them (within 5s on a loaded
			// machine, far under the poll).
			if lag := (<-got).Sub(released); lag < 0 || lag > 5*time.Second {
				t.Errorf("reader got the lock %v after the writer left", lag)
			}
		}
	})

	t.Run("DeadReader", func(t *testing.T) {
		// A reader's process dies; the writer gets in when its lease ends.
		// Another reader holds on meanwhile, and leaves: the dead reader
		// must drop out by itself, not by the keys expiring.
		const lease = 300 * time.Millisecond
		name := rwName(t, r)
		rw := r.RWLock(name)
		live := must(t)(rw.ObtainRead(ctx, 10*time.Second))
		other := otherClient(t, rdb)
		dead, err := NewRedis(other).RWLock(name).ObtainRead(ctx, lease, WithWatchdog(0))
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(lease / 2)
		other.Close()
		mustRelease(t, live)
		died := time.Now()
		w := must(t)(rw.ObtainWrite(waitCtx(t, 5*time.Second), 10*time.Second, Wait()))
		// A reader never dropped keeps the writer out for good, and its
		// poll is 30 s: 2 s tells those apart on a loaded machine.
		if d := time.Since(died); d < lease/3 || d > 2*time.Second {
			t.Errorf("writer got in %v after the reader died, its lease %v", d, lease)
		}
		within(t, lease, dead.Done(), "the dead reader's Done")
		mustRelease(t, w)
	})

	t.Run("DeadWaitingWriter", func(t *testing.T) {
		// A writer dies while it waits: its intent keeps readers out for
		// a while (3 polls), then they go on.
		r := NewRedis(rdb)
		r.maxPoll = 100 * time.Millisecond
		name := rwName(t, r)
		rw := r.RWLock(name)
		reader := must(t)(rw.ObtainRead(ctx, 10*time.Second))
		defer mustRelease(t, reader)
		other := otherClient(t, rdb)
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		waiting := make(chan error, 1)
		dr := NewRedis(other)
		dr.maxPoll = r.maxPoll
		go func() {
			_, err := dr.RWLock(name).ObtainWrite(wctx, time.Second, Wait())
			waiting <- err
		}()
		deadline := time.Now().Add(5 * time.Second)
		for rdb.ZCard(ctx, rwKeysFor(name).intents).Val() == 0 {
			if time.Now().After(deadline) {
				t.Fatal("the writer left no intent")
			}
			time.Sleep(5 * time.Millisecond)
		}
		lk, err := rw.ObtainRead(ctx, time.Second)
		notAcquired(t, "read while a writer waits", lk, err)
		other.Close() // the writer's process dies; its withdrawal never arrives
		if err := <-waiting; err == nil {
			t.Fatal("the dead writer got the lock")
		}
		died := time.Now()
		lk = must(t)(rw.ObtainRead(waitCtx(t, 5*time.Second), time.Second, Wait()))
		// The intent ends 300 ms after the writer's last try at most; one
		// never dropped keeps readers out for good.
		if d := time.Since(died); d > 2*time.Second {
			t.Errorf("readers waited %v for a dead writer", d)
		}
		mustRelease(t, lk)
	})

	t.Run("GivingUpLetsReadersIn", func(t *testing.T) {
		rw := r.RWLock(rwName(t, r))
		reader := must(t)(rw.ObtainRead(ctx, 10*time.Second))
		defer mustRelease(t, reader)
		wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		if _, err := rw.ObtainWrite(wctx, time.Second, Wait()); err != context.DeadlineExceeded {
			t.Fatalf("writer at its deadline: got %v", err)
		}
		mustRelease(t, must(t)(rw.ObtainRead(ctx, time.Second)))
	})

	t.Run("Unsupported", func(t *testing.T) {
		rw := r.RWLock(rwName(t, r))
		if _, err := rw.ObtainRead(ctx, time.Second, WithFencing()); !errors.Is(err, ErrUnsupported) {
			t.Errorf("got %v, want ErrUnsupported", err)
		}
	})
}
