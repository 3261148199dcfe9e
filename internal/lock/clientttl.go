package lock

import (
	"sync"
	"time"
)

// clientTTL keeps a lock's ttl on the client, for the backends whose
// server ties a lock to a session or lease that lives as long as its
// client (etcd, ZooKeeper): when the ttl runs out without renewal, drop
// gives the lock up on the server, as Redis would expire its key. A
// holder embeds it and takes mu around its own calls.
type clientTTL struct {
	mu     sync.Mutex
	ended  bool        // given up; guarded by mu
	until  time.Time   // when the ttl runs out; guarded by mu
	expiry *time.Timer // fires at until; guarded by mu
	drop   func()      // ends the lock on the server; run once, under mu
}

// keep starts the ttl: until is when it runs out.
func (k *clientTTL) keep(until time.Time, drop func()) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.until, k.drop = until, drop
	k.expiry = time.AfterFunc(time.Until(until), k.expire)
}

// expire gives the lock up when its ttl ran out. A renewal may have moved
// until while this waited for mu: then it waits on.
func (k *clientTTL) expire() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if time.Now().Before(k.until) {
		return
	}
	k.end()
}

// end gives the lock up for good; the caller holds mu.
func (k *clientTTL) end() {
	if !k.ended {
		k.ended = true
		k.expiry.Stop()
		k.drop()
	}
}

// renewed moves the deadline to ttl from now; the caller holds mu.
func (k *clientTTL) renewed(ttl time.Duration) {
	k.until = time.Now().Add(ttl)
	k.expiry.Reset(ttl)
}
