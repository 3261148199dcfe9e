package live

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
)

// crowdServer is a liveServer with a crowd whose presses go to a fake buy
// button, which answers once release is closed; phones lists the users
// the crowd signed in.
type crowdServer struct {
	liveServer
	release chan struct{}
	mu      sync.Mutex
	phones  map[string]bool
}

func newCrowdServer(t *testing.T) *crowdServer {
	t.Helper()
	ls := newLiveServer(t, MaxStreams)
	cs := &crowdServer{liveServer: ls, release: make(chan struct{}), phones: map[string]bool{}}
	crowd := NewCrowd(func(_ context.Context, phone string) (string, error) {
		cs.mu.Lock()
		cs.phones[phone] = true
		cs.mu.Unlock()
		return "token-" + phone, nil
	}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	target := gin.New()
	target.POST("/seckill/:voucherId", func(c *gin.Context) {
		select {
		case <-cs.release:
		case <-c.Request.Context().Done():
		}
		c.Status(http.StatusConflict)
	})
	crowd.SetTarget(target)
	t.Cleanup(crowd.Close)
	ls.h.crowd = crowd
	return cs
}

func (cs *crowdServer) post(t *testing.T, body string) (int, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	resp, err := http.Post(cs.url+"/live/"+cs.voucher+"/crowd", "application/json", rd)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got map[string]any
	json.NewDecoder(resp.Body).Decode(&got)
	return resp.StatusCode, got
}

// A crowd's body is checked as the OpenAPI file says: users and rate from
// 1 to 20,000, a 0 refused (it used to start 500 users); absent or null,
// a field takes its default, and no body at all is all defaults. While a
// crowd buys a voucher, another is refused with 429 and a message that
// says so; the next one is new users, never the last crowd's.
func TestCrowdInput(t *testing.T) {
	cs := newCrowdServer(t)
	for _, body := range []string{`{"users":0}`, `{"rate":0}`, `{"users":-1}`, `{"users":20001}`, `{"rate":20001}`,
		`{"users":"5"}`, `{"users":1.5}`, `[]`, `{"users":`} {
		if status, got := cs.post(t, body); status != http.StatusBadRequest {
			t.Errorf("crowd %s: %d %v, want 400", body, status, got)
		}
	}
	if len(cs.phones) != 0 {
		t.Fatalf("refused crowds signed in %d users", len(cs.phones))
	}
	// An empty body sent chunked, without a length, is no body too.
	req, _ := http.NewRequest(http.MethodPost, cs.url+"/live/"+cs.voucher+"/crowd", io.NopCloser(strings.NewReader("")))
	req.ContentLength = -1
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("an empty chunked body: %v %v, want 202", resp, err)
	} else {
		resp.Body.Close()
	}
	close(cs.release)
	cs.waitDone(t)

	// Each start below is let finish (release) before the next.
	first := -1
	for _, tt := range []struct {
		body        string
		users, rate int
	}{
		{``, 500, 1000},
		{`{}`, 500, 1000},
		{`{"users":null,"rate":null}`, 500, 1000},
		{`{"users":3}`, 3, 1000},
		{`{"users":2,"rate":20000}`, 2, 20000},
	} {
		cs.release = make(chan struct{})
		status, got := cs.post(t, tt.body)
		if status != http.StatusAccepted || got["users"] != float64(tt.users) || got["rate"] != float64(tt.rate) {
			t.Fatalf("crowd %q: %d %v, want 202 with %d users at %d", tt.body, status, got, tt.users, tt.rate)
		}
		lo, _ := strconv.Atoi(got["first_phone"].(string))
		hi, _ := strconv.Atoi(got["last_phone"].(string))
		if hi-lo+1 != tt.users || lo < 10_000_000_000 || lo <= first {
			t.Errorf("crowd %q: phones %v to %v, want %d new ones after the last crowd's", tt.body, got["first_phone"], got["last_phone"], tt.users)
		}
		first = hi

		// Refused while it runs, and clearly.
		if status, got := cs.post(t, `{"users":1}`); status != http.StatusTooManyRequests ||
			!strings.Contains(got["error"].(map[string]any)["message"].(string), "a crowd is already buying this voucher") {
			t.Errorf("a second crowd while one runs: %d %v, want 429 saying one is buying", status, got)
		}
		close(cs.release)
		cs.waitDone(t)
		cs.mu.Lock()
		for p := lo; p <= hi; p++ {
			if !cs.phones[strconv.Itoa(p)] {
				t.Errorf("crowd %q: phone %d never signed in", tt.body, p)
			}
		}
		if n := len(cs.phones); n < hi-lo+1 {
			t.Errorf("crowd %q: %d phones signed in", tt.body, n)
		}
		cs.mu.Unlock()
	}
}

// waitDone waits until the voucher's crowd is done.
func (cs *crowdServer) waitDone(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, busy := cs.h.crowd.running.Load(mustID(t, cs.voucher)); busy; _, busy = cs.h.crowd.running.Load(mustID(t, cs.voucher)) {
		if time.Now().After(deadline) {
			t.Fatal("the crowd still runs after 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func mustID(t *testing.T, s string) int64 {
	t.Helper()
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return id
}
