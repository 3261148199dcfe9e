package lock

import (
	"context"
	"errors"
	"sync"
	"time"
)

// clientTTL keeps a lock's deadline on the client, for the backends whose
// server ties a lock to a session or a lease rather than to the lock's ttl
// (etcd, ZooKeeper). Two times bound it:
//
//   - until, when the lock's own ttl runs out. Nothing expires on the
//     server then, so drop gives the lock up there, as Redis would expire
//     its key.
//   - promised, how long the server has promised to keep the lease or
//     session: its timeout, counted from before the last request the
//     server answered (it may have been handled at any moment of the round
//     trip). A holder cut off from the server cannot renew, and the server
//     drops its lock at the end of the promise, whatever the ttl says. A
//     holder that trusted its ttl instead would work on while the server
//     hands the lock to somebody else.
//
// When the earlier of the two passes, the lock ends here too: its handle is
// told (Done closes) and drop runs. While the promise is the earlier, a loop
// asks the server again every period, and each answer moves the promise
// on, so a holder in touch keeps its lock for its whole ttl. A holder
// embeds clientTTL and takes mu around its own state, never around a
// request: a request that hangs must not hold the deadline up.
type clientTTL struct {
	mu       sync.Mutex
	ended    bool             // given up; guarded by mu
	lostWhy  string           // why it ended, if not by release; guarded by mu
	until    time.Time        // guarded by mu
	promised time.Time        // guarded by mu
	expiry   *time.Timer      // fires at the deadline; guarded by mu
	tell     func(why string) // ends the handle; nil until attach; guarded by mu

	// Set by keep, then only read.
	confirm func(context.Context) (time.Time, error) // asks the server for a new promise
	drop    func()                                   // ends the lock on the server
	stop    chan struct{}                            // closed when the lock ends
}

// promise is how long a server whose lease or session lasts d keeps it
// after a request sent at sent: d from the send, less a margin for the two
// clocks' drift.
func promise(sent time.Time, d time.Duration) time.Time {
	return sent.Add(d - drift(d))
}

// keep starts the deadline: the ttl runs out at until, the server's promise
// at promised. While the promise is the earlier, confirm is asked every
// period for a new one; it returns ErrNotHeld if the server no longer has
// the lock.
func (k *clientTTL) keep(until, promised time.Time, period time.Duration, confirm func(context.Context) (time.Time, error), drop func()) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.until, k.promised = until, promised
	k.confirm, k.drop = confirm, drop
	k.stop = make(chan struct{})
	k.expiry = time.AfterFunc(time.Until(k.deadline()), k.expire)
	go k.confirmEvery(period)
}

// attach makes lk, the handle of this lock, hear of a deadline that passed
// here, or of a loss the loop found: the handle's own deadline knows only
// the ttl.
func (k *clientTTL) attach(lk *handle) {
	k.mu.Lock()
	k.tell = func(why string) { lk.end(lk.errLost(why), false) }
	why := k.lostWhy
	k.mu.Unlock()
	if why != "" {
		lk.end(lk.errLost(why), false) // it ended before the handle existed
	}
}

// deadline is the earlier of the ttl and the server's promise; the caller
// holds mu.
func (k *clientTTL) deadline() time.Time {
	if k.promised.Before(k.until) {
		return k.promised
	}
	return k.until
}

// live reports whether the lock has not ended yet.
func (k *clientTTL) live() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return !k.ended
}

// end marks the lock given up and reports whether it was live; the caller
// holds mu. why is empty for a release.
func (k *clientTTL) end(why string) bool {
	if k.ended {
		return false
	}
	k.ended, k.lostWhy = true, why
	k.expiry.Stop()
	close(k.stop)
	return true
}

// released marks the lock given up by its holder, who removes it from the
// server itself. It reports whether the lock was live.
func (k *clientTTL) released() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.end("")
}

// expire runs at the deadline. A renewal may have moved the deadline while
// this waited for mu: then it waits on.
func (k *clientTTL) expire() {
	k.mu.Lock()
	if time.Now().Before(k.deadline()) {
		k.mu.Unlock()
		return
	}
	why := "expired"
	if k.promised.Before(k.until) {
		why = "outlived what the server promised: it may have dropped it"
	}
	k.finish(why)
}

// lose ends a lock that the server no longer has.
func (k *clientTTL) lose(why string) {
	k.mu.Lock()
	k.finish(why)
}

// finish ends the lock for why and unlocks mu, which the caller holds.
// Then it tells the handle, first (its holder must stop at once), and
// drops the lock on the server, which may take a while.
func (k *clientTTL) finish(why string) {
	live := k.end(why)
	tell := k.tell
	k.mu.Unlock()
	if !live {
		return
	}
	if tell != nil {
		tell(why)
	}
	k.drop()
}

// renew records the answer to a renewal for ttl sent at sent: the ttl runs
// from sent, and the server's promise moves on to promised. A lock the
// server no longer has is lost.
func (k *clientTTL) renew(sent time.Time, ttl time.Duration, promised time.Time, err error) error {
	switch {
	case errors.Is(err, ErrNotHeld):
		k.lose("was lost")
		return ErrNotHeld
	case err != nil:
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.ended {
		return ErrNotHeld
	}
	k.until = sent.Add(ttl)
	k.promised = later(k.promised, promised)
	k.expiry.Reset(time.Until(k.deadline()))
	return nil
}

// confirmEvery asks the server for a new promise every period, as long as
// the promise ends before the ttl. An answer that the lock is gone loses
// it; a failed request is not a loss: the next tick retries, and the
// deadline ends the lock if none succeeds in time.
func (k *clientTTL) confirmEvery(period time.Duration) {
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		select {
		case <-k.stop:
			return
		case <-tick.C:
		}
		k.mu.Lock()
		needed := k.promised.Before(k.until)
		k.mu.Unlock()
		if !needed {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), period)
		promised, err := k.confirm(ctx)
		cancel()
		switch {
		case err == nil:
			k.mu.Lock()
			if !k.ended {
				k.promised = later(k.promised, promised)
				k.expiry.Reset(time.Until(k.deadline()))
			}
			k.mu.Unlock()
		case errors.Is(err, ErrNotHeld):
			k.lose("was lost")
		}
	}
}

// later returns the later of a and b. Two promises may come back out of
// order (a renewal and the loop's request); each holds, so the later does.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// orAbandon runs do, and waits for it until ctx ends. It is for calls that
// may outlive ctx: the zk client's take no context at all, and etcd's
// Mutex.Lock, cut short, cleans up with no deadline. If ctx ends first,
// orAbandon returns ctx.Err() at once and do runs on; undo then gives back
// whatever do took, if it succeeded after all. A nil undo means do took
// nothing.
func orAbandon[T any](ctx context.Context, do func() (T, error), undo func(T)) (T, error) {
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := do()
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
		if undo != nil {
			go func() {
				if r := <-done; r.err == nil {
					undo(r.v)
				}
			}()
		}
		var zero T
		return zero, ctx.Err()
	}
}
