package admission

import (
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
	for range 2 {
		wg.Go(func() {
			w := httptest.NewRecorder()
			r.ServeHTTP(w, httptest.NewRequest("GET", "/slow", nil))
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
