// Package admission turns away, at once and before any Redis or MySQL
// work, the requests an instance should not take on:
//
//   - a user clicking faster than any person does (a bot, a script, a
//     stuck retry loop): a token bucket per user on the buy button;
//   - more requests at once than the instance's pools can serve: a cap on
//     requests in flight, shared fairly among client addresses;
//   - more connections from one address than any client needs: a cap per
//     address on the listener, and one per IPv6 /48 (conns.go).
//
// Both answer 429 busy with a Retry-After header. The point is the speed
// of the no: a request refused here costs microseconds and no connection,
// while a request let in past what the pools can serve waits for a
// connection, times out after seconds, and meanwhile holds memory and a
// goroutine, so that under a load far beyond capacity every request ends in
// a timeout, the good ones too.
//
// Both are per instance, in memory: no Redis round trip. A user's limit is
// then per instance (a load balancer spreading one user over three
// instances lets them through three times as fast), which is fine for its
// purpose: keeping one client from taking an instance's capacity.
package admission

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"

	"seckill/internal/apperr"
	"seckill/internal/auth"
)

var (
	// ErrTooFast answers a user over their rate.
	ErrTooFast = apperr.New(apperr.Busy, "too many requests from you; try again after Retry-After seconds")
	// ErrOverloaded answers a request beyond the instance's cap.
	ErrOverloaded = apperr.New(apperr.Busy, "the server is at capacity; try again after Retry-After seconds")
)

// Buckets is a token bucket per user: each holds up to burst tokens and
// gains rate tokens a second; a request takes one, or is refused. It is
// safe for concurrent use.
//
// A full bucket is the same as no bucket, so buckets that have filled up
// are dropped now and then: memory grows with the users active in the
// last burst/rate seconds, not with all users ever seen.
type Buckets struct {
	rate  float64 // tokens a second
	burst float64
	now   func() time.Time
	epoch time.Time // bucket times count from here

	shards [64]shard // by user: one lock per shard, not one for all
}

type shard struct {
	mu      sync.Mutex
	buckets map[int64]bucket
	takes   int
}

// bucket holds no pointer (its time is a count of nanoseconds, not a
// time.Time, whose location is a pointer), so a map of a sale's tens of
// thousands of buckets is never scanned by the garbage collector.
type bucket struct {
	tokens float64
	at     time.Duration // since epoch: when tokens was last brought up to date
}

// NewBuckets returns Buckets of rate tokens a second and burst tokens at
// most; rate 0 turns the limit off.
func NewBuckets(rate float64, burst int, now func() time.Time) *Buckets {
	b := &Buckets{rate: rate, burst: float64(max(burst, 1)), now: now, epoch: now()}
	for i := range b.shards {
		b.shards[i].buckets = map[int64]bucket{}
	}
	return b
}

// Take takes a token of user's bucket. If there is none it returns false
// and how long until there is one.
func (b *Buckets) Take(user int64) (bool, time.Duration) {
	if b.rate <= 0 {
		return true, 0
	}
	s := &b.shards[uint64(user)%uint64(len(b.shards))]
	now := b.now().Sub(b.epoch)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.takes++; s.takes >= 4096 {
		s.takes = 0
		s.dropFull(now, b)
	}
	k, ok := s.buckets[user]
	if !ok {
		k = bucket{tokens: b.burst, at: now}
	}
	k.refill(now, b)
	taken := k.tokens >= 1
	if taken {
		k.tokens--
	}
	s.buckets[user] = k
	if taken {
		return true, 0
	}
	return false, time.Duration((1 - k.tokens) / b.rate * float64(time.Second))
}

func (k *bucket) refill(now time.Duration, b *Buckets) {
	if d := (now - k.at).Seconds(); d > 0 {
		k.tokens = min(b.burst, k.tokens+d*b.rate)
		k.at = now
	}
}

// dropFull forgets the buckets that have filled up again.
func (s *shard) dropFull(now time.Duration, b *Buckets) {
	for user, k := range s.buckets {
		if k.refill(now, b); k.tokens >= b.burst {
			delete(s.buckets, user)
		}
	}
}

// PerUser is a gin middleware, after authentication, that refuses a user
// over their rate before the handler does any work.
func (b *Buckets) PerUser(fail func(*gin.Context, error)) gin.HandlerFunc {
	return func(c *gin.Context) {
		if ok, wait := b.Take(auth.From(c).UserID); !ok {
			fail(c, apperr.RetryAfter(ErrTooFast, wait))
			return
		}
		c.Next()
	}
}

// Cap bounds the requests an instance works on at once, and shares them
// fairly among client addresses: once half the slots are taken, an
// address holds at most half of them divided among the addresses holding
// any (itself counted). A lone client (a load test, or every client
// behind a proxy not named in TRUSTED_PROXIES) may hold half the slots;
// k addresses that flood at once are held to 1/(2k) each, so that, as
// their requests end and are refused again, together they keep at most
// half and the other half serves everyone else. Without the share, one
// address sending requests as fast as it could held every slot, and every
// buyer was told 429. A newcomer (an address holding none) is let in
// while any slot is free.
//
// The share is a site's: an IPv6 /48 (65,536 /64s, each an address to
// the limits that count addresses), or an IPv4 address. A site's /64s
// share its share the same way among themselves: once half the slots are
// taken, a /64 holding some holds at most its site's share divided among
// the site's /64s holding any. Shared by /64 alone, a flood from every /64
// of one /48 was 65,536 newcomers, each let in while a slot was free, and
// held every slot.
//
// A slot is taken once the request's body has arrived (web.ReadBody runs
// first): a client that trickles its body in holds a connection, not a
// slot.
type Cap struct {
	n int // slots; 0: no cap

	mu    sync.Mutex
	total int
	sites map[string]int // slots by site (sharesOf), the sites holding any
	addrs map[string]int // slots by IPv6 /64 (web.AddrKey), the /64s holding any
	width map[string]int // by IPv6 site: how many of its /64s hold any

	refused atomic.Int64 // when a request was last refused, in Unix ns
}

// NewCap returns a Cap of n requests at once; n 0 turns it off.
func NewCap(n int) *Cap {
	return &Cap{n: max(n, 0), sites: map[string]int{}, addrs: map[string]int{}, width: map[string]int{}}
}

// take takes a slot for a client of site and, within it, address key
// (sharesOf), if the cap and the shares (its site's, and its own within
// the site) allow. An IPv4 address is its own site (key == site): it has
// no addresses within to share among, and nothing is counted twice.
//
// Nothing here allocates once the maps have grown to the sites in
// flight: it runs twice on every request (take and give), and the
// cheapest answer, sold out, costs some tens of microseconds in all.
func (cp *Cap) take(site, key string) bool {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if cp.total >= cp.n {
		return false
	}
	if held := cp.sites[site]; held > 0 && cp.total >= cp.n/2 {
		share := max(cp.n/(2*len(cp.sites)), 1)
		if held >= share {
			return false
		}
		// A /48's /64s divide its share.
		if key != site {
			if mine := cp.addrs[key]; mine > 0 && mine >= max(share/cp.width[site], 1) {
				return false
			}
		}
	}
	cp.total++
	cp.sites[site]++
	if key != site {
		if cp.addrs[key]++; cp.addrs[key] == 1 {
			cp.width[site]++
		}
	}
	return true
}

// give gives back a slot taken by take(site, key). The maps keep only
// what is in flight.
func (cp *Cap) give(site, key string) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	cp.total--
	release(cp.sites, site)
	if key != site {
		if cp.addrs[key] <= 1 {
			release(cp.width, site)
		}
		release(cp.addrs, key)
	}
}

// Load is the cap's state, for /readyz: requests in flight, the cap, and
// whether the cap refused a request in the last second (the instance is
// saturated: clients are being told 429).
func (cp *Cap) Load() (inFlight, capacity int, saturated bool) {
	cp.mu.Lock()
	inFlight = cp.total
	cp.mu.Unlock()
	last := cp.refused.Load()
	return inFlight, cp.n, last != 0 && time.Since(time.Unix(0, last)) < time.Second
}

// Limit is a gin middleware that lets a request in if a slot is free, and
// answers 429 busy at once otherwise: never a queue, which would only turn
// overload into timeouts. The paths in exempt (health checks) always pass;
// one ending in "*" names the paths that begin with the rest (a stream of
// events that lasts as long as its page is open must not hold a slot).
func (cp *Cap) Limit(fail func(*gin.Context, error), exempt ...string) gin.HandlerFunc {
	skip := map[string]bool{}
	var prefixes []string
	for _, p := range exempt {
		if prefix, ok := strings.CutSuffix(p, "*"); ok {
			prefixes = append(prefixes, prefix)
		} else {
			skip[p] = true
		}
	}
	exempted := func(path string) bool {
		if skip[path] {
			return true
		}
		for _, p := range prefixes {
			if strings.HasPrefix(path, p) {
				return true
			}
		}
		return false
	}
	return func(c *gin.Context) {
		if cp.n == 0 || exempted(c.Request.URL.Path) {
			c.Next()
			return
		}
		// ClientIP: behind a proxy in TRUSTED_PROXIES, the client it
		// names, else the connection's peer.
		site, key := sharesOf(c.ClientIP())
		if !cp.take(site, key) {
			cp.refused.Store(time.Now().UnixNano())
			fail(c, apperr.RetryAfter(ErrOverloaded, time.Second))
			return
		}
		defer cp.give(site, key)
		c.Next()
	}
}
