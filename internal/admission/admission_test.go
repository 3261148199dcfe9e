package admission

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"seckill/internal/apperr"
	"seckill/internal/web"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// A user gets the burst at once, then rate a second; another user's
// bucket is their own.
func TestBuckets(t *testing.T) {
	c := &clock{t: time.Unix(1_700_000_000, 0)}
	b := NewBuckets(10, 20, c.now)
	for i := range 20 {
		if ok, _ := b.Take(1); !ok {
			t.Fatalf("request %d of the burst refused", i+1)
		}
	}
	ok, wait := b.Take(1)
	if ok || wait <= 0 || wait > 100*time.Millisecond {
		t.Fatalf("21st request: %v, wait %s; want refused, about 100ms", ok, wait)
	}
	if ok, _ := b.Take(2); !ok {
		t.Fatal("another user was refused: buckets are per user")
	}
	c.add(250 * time.Millisecond) // 2.5 tokens
	for i := range 2 {
		if ok, _ := b.Take(1); !ok {
			t.Fatalf("refill: request %d refused", i+1)
		}
	}
	if ok, _ := b.Take(1); ok {
		t.Fatal("refill gave more than rate × time")
	}
	if ok, _ := NewBuckets(0, 1, c.now).Take(1); !ok {
		t.Fatal("rate 0 must turn the limit off")
	}
}

// Buckets that filled up again are forgotten: memory follows the users
// active lately, not all users ever seen.
func TestBucketsForgetFullOnes(t *testing.T) {
	c := &clock{t: time.Unix(1_700_000_000, 0)}
	b := NewBuckets(10, 20, c.now)
	for u := range int64(100_000) {
		b.Take(u)
	}
	c.add(3 * time.Second) // every bucket full again
	// Each shard sweeps every 4096 takes; other users' takes drive it.
	for u := range int64(len(b.shards) * 4096) {
		b.Take(1_000_000 + u)
	}
	old := 0
	for i := range b.shards {
		for u := range b.shards[i].buckets {
			if u < 100_000 {
				old++
			}
		}
	}
	if old > 0 {
		t.Fatalf("%d full buckets kept, want them forgotten", old)
	}
}

// Beyond the cap a request is answered 429 busy with Retry-After at once,
// not queued; health checks always pass; a freed slot is used again.
func TestCap(t *testing.T) {
	gin.SetMode(gin.TestMode)
	r := gin.New()
	fail := func(c *gin.Context, err error) { web.Error(c, nil, err) }
	r.Use(NewCap(2).Limit(fail, "/healthz", "/live/*"))
	release := make(chan struct{})
	entered := make(chan struct{}, 2)
	r.GET("/slow", func(c *gin.Context) { entered <- struct{}{}; <-release; c.Status(http.StatusOK) })
	r.GET("/healthz", func(c *gin.Context) { c.Status(http.StatusOK) })
	r.GET("/live/:id/events", func(c *gin.Context) { c.Status(http.StatusOK) })

	var wg sync.WaitGroup
	for i := range 2 { // from two addresses: one may hold but half the slots
		wg.Go(func() {
			w := httptest.NewRecorder()
			req := httptest.NewRequest("GET", "/slow", nil)
			req.RemoteAddr = fmt.Sprintf("192.0.2.%d:1234", i+1)
			r.ServeHTTP(w, req)
		})
	}
	<-entered
	<-entered
	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest("GET", "/slow", nil))
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") == "" {
		t.Fatalf("third request: %d %q (Retry-After %q), want 429 with Retry-After", w.Code, w.Body, w.Header().Get("Retry-After"))
	}
	if !apperrIsBusy(w.Body.String()) {
		t.Fatalf("body %s, want the busy envelope", w.Body)
	}
	w = httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest("GET", "/healthz", nil))
	if w.Code != http.StatusOK {
		t.Fatalf("health check at capacity: %d, want 200", w.Code)
	}
	w = httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest("GET", "/live/7/events", nil))
	if w.Code != http.StatusOK {
		t.Fatalf("a path under an exempt prefix at capacity: %d, want 200", w.Code)
	}
	close(release)
	wg.Wait()
	r.GET("/fast", func(c *gin.Context) { c.Status(http.StatusOK) })
	w = httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest("GET", "/fast", nil))
	if w.Code != http.StatusOK {
		t.Fatalf("after the slots freed: %d, want 200", w.Code)
	}
}

func apperrIsBusy(body string) bool {
	return body == `{"error":{"code":"`+string(apperr.Busy)+`","message":"`+ErrOverloaded.Message+`"}}`
}

// Once half the slots are taken, an address holds at most half of them
// divided among the addresses holding any: a lone client gets half, a
// second a quarter, and so on; a newcomer gets in while a slot is free;
// a flooding address whose requests end is held to its smaller share.
func TestCapShares(t *testing.T) {
	cp := NewCap(8)
	take := func(addr string, n int) int { return takeN(cp, addr, n) }
	if got := take("a", 8); got != 4 {
		t.Fatalf("a lone address took %d of 8 slots, want 4 (half)", got)
	}
	if got := take("b", 8); got != 2 {
		t.Fatalf("a second address took %d, want 2 (8/2 shared by 2)", got)
	}
	if got := take("c", 8); got != 1 {
		t.Fatalf("a third address took %d, want 1 (8/2 shared by 3)", got)
	}
	if got := take("d", 8); got != 1 {
		t.Fatalf("a fourth address took %d, want the last 1", got)
	}
	if got := take("e", 1); got != 0 {
		t.Fatalf("a full cap let a request in")
	}
	// a's requests end; a asks again: four addresses hold slots, so a's
	// share is 8/2/4 = 1.
	for range 4 {
		cp.give(sharesOf("a"))
	}
	if got := take("a", 4); got != 1 {
		t.Fatalf("the flooding address, its requests ended, took %d again, want 1", got)
	}
	if got := take("e", 4); got != 1 {
		t.Fatalf("a newcomer then took %d, want 1 (let in; then its share, 8/2 shared by 5)", got)
	}
	if n, capacity, _ := cp.Load(); n != 6 || capacity != 8 {
		t.Fatalf("Load = %d of %d, want 6 of 8", n, capacity)
	}
	for a, n := range map[string]int{"a": 1, "b": 2, "c": 1, "d": 1, "e": 1} {
		for range n {
			cp.give(sharesOf(a))
		}
	}
	if len(cp.sites)+len(cp.addrs)+len(cp.width) != 0 || cp.total != 0 {
		t.Fatalf("after every slot is given back: %d held by %v %v %v", cp.total, cp.sites, cp.addrs, cp.width)
	}
}

// A flood of requests from one address, each held in flight, leaves
// another address's request served; the cap says it is saturated.
func TestCapFloodLeavesOthersServed(t *testing.T) {
	gin.SetMode(gin.TestMode)
	r := gin.New()
	fail := func(c *gin.Context, err error) { web.Error(c, nil, err) }
	cp := NewCap(16)
	r.Use(cp.Limit(fail))
	release := make(chan struct{})
	r.GET("/slow", func(c *gin.Context) { <-release; c.Status(http.StatusOK) })
	r.GET("/fast", func(c *gin.Context) { c.Status(http.StatusOK) })

	var wg sync.WaitGroup
	codes := make(chan int, 40)
	for range 40 {
		wg.Go(func() {
			w := httptest.NewRecorder()
			req := httptest.NewRequest("GET", "/slow", nil)
			req.RemoteAddr = "198.51.100.7:999"
			r.ServeHTTP(w, req)
			codes <- w.Code
		})
	}
	// The flood's refusals come back at once; its admitted requests
	// wait for release.
	for range 40 - 8 {
		if c := <-codes; c != http.StatusTooManyRequests {
			t.Fatalf("flood: %d before release, want 429", c)
		}
	}
	if _, _, saturated := cp.Load(); !saturated {
		t.Error("Load does not say saturated after refusals")
	}
	w := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/fast", nil)
	req.RemoteAddr = "203.0.113.9:1"
	r.ServeHTTP(w, req)
	if w.Code != http.StatusOK {
		t.Fatalf("another address during the flood: %d, want 200", w.Code)
	}
	close(release)
	wg.Wait()
}

// takeN tries n slots of cp for addr and returns how many it got.
func takeN(cp *Cap, addr string, n int) int {
	got := 0
	for range n {
		if cp.take(sharesOf(addr)) {
			got++
		}
	}
	return got
}
