//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// serve starts an httptest server with h and returns its URL.
func serve(t *testing.T, h http.HandlerFunc) *url.URL {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// newPlan is a plan of POSTs to u at rate for duration after warmup, with
// one request per token (or one request without tokens).
func newPlan(u *url.URL, rate float64, warmup, duration time.Duration, conns int, tokens ...string) *plan {
	return &plan{
		addr: u.Host, requests: render("POST", u, nil, nil, tokens),
		rate: rate, warmup: warmup, duration: duration, conns: conns,
		timeout: 5 * time.Second, late: time.Millisecond,
	}
}

func runPlan(t *testing.T, p *plan) *outcome {
	t.Helper()
	o, err := p.run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// TestStallShowsInTheTail is the coordinated-omission test. The server
// stops answering for 200 ms once, a second into a run of 2,000 requests
// a second on four connections. A closed loop would time at most four
// requests across the stall (the four it had written), 0.1% of the run:
// its p99.9 (the 5th slowest of 4,000) would not show it. Timed from when
// they were due, the ~400 requests due during the stall all waited for
// it, up to 200 ms, and p99.9 is close to 200 ms.
func TestStallShowsInTheTail(t *testing.T) {
	var (
		mu         sync.Mutex
		first      time.Time
		stallUntil time.Time
	)
	u := serve(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		now := time.Now()
		if first.IsZero() {
			first = now
		}
		if stallUntil.IsZero() && now.Sub(first) >= time.Second {
			stallUntil = now.Add(200 * time.Millisecond)
		}
		until := stallUntil
		mu.Unlock()
		time.Sleep(time.Until(until)) // every request stalls until then
		w.WriteHeader(http.StatusConflict)
	})
	o := runPlan(t, newPlan(u, 2000, 0, 2*time.Second, 4))

	if got := len(o.latencies); got != 4000 {
		t.Fatalf("%d answers, want 4000 (errors %v, unsent %d)", got, o.errors, o.unsent)
	}
	p999 := percentile(o.latencies, 99.9)
	slow := 0
	for _, d := range o.latencies {
		if d >= 100*time.Millisecond {
			slow++
		}
	}
	t.Logf("p50 %v p99 %v p99.9 %v max %v; %d answers >= 100 ms, %d late, %d queued", percentile(o.latencies, 50),
		percentile(o.latencies, 99), p999, o.latencies[len(o.latencies)-1], slow, o.late, o.queued)
	if p999 < 180*time.Millisecond {
		t.Errorf("p99.9 %v: the 200 ms stall does not show", p999)
	}
	// Those due in the stall's first half waited at least 100 ms: about
	// 200 of them; a closed loop on four connections would time four.
	if slow < 40 {
		t.Errorf("%d answers took 100 ms or more, want about 200: requests due during the stall were timed from when they were written", slow)
	}
	if o.late < 100 || o.queued < 100 {
		t.Errorf("%d requests late, %d queued for a connection, want the ~400 due during the stall", o.late, o.queued)
	}
}

// TestStatusesCounted: statuses by token (a 200, b 409, c 429), the
// warm-up sent but not counted, every token in turn.
func TestStatusesCounted(t *testing.T) {
	var mu sync.Mutex
	received := 0
	u := serve(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		received++
		mu.Unlock()
		switch r.Header.Get("Authorization") {
		case "Bearer a":
			w.WriteHeader(http.StatusOK)
		case "Bearer b":
			w.WriteHeader(http.StatusConflict)
		case "Bearer c":
			w.WriteHeader(http.StatusTooManyRequests)
		default:
			w.WriteHeader(http.StatusUnauthorized)
		}
		io.WriteString(w, `{"error":{"code":"x"}}`)
	})
	o := runPlan(t, newPlan(u, 600, 500*time.Millisecond, time.Second, 8, "a", "b", "c"))

	want := map[int]int{200: 200, 409: 200, 429: 200}
	if len(o.statuses) != len(want) || o.statuses[200] != 200 || o.statuses[409] != 200 || o.statuses[429] != 200 {
		t.Errorf("statuses %v, want %v", o.statuses, want)
	}
	if o.sent != 600 || len(o.latencies) != 600 || o.unsent != 0 || len(o.errors) != 0 {
		t.Errorf("sent %d answered %d unsent %d errors %v, want 600 sent and answered", o.sent, len(o.latencies), o.unsent, o.errors)
	}
	mu.Lock()
	defer mu.Unlock()
	if received != 900 {
		t.Errorf("the server received %d requests, want 900 (300 of them the warm-up)", received)
	}
}

// TestRateHeld: 1,000 requests a second for a second arrive spread over
// the second, none before it was due, and the rate achieved is the rate.
func TestRateHeld(t *testing.T) {
	var (
		mu       sync.Mutex
		arrivals []time.Time
	)
	u := serve(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		arrivals = append(arrivals, time.Now())
		mu.Unlock()
	})
	p := newPlan(u, 1000, 0, time.Second, 8)
	o := runPlan(t, p)
	rep := newReport("POST", u.String(), p, o)

	mu.Lock()
	defer mu.Unlock()
	if len(arrivals) != 1000 {
		t.Fatalf("%d requests arrived, want 1000", len(arrivals))
	}
	// Request i is due at i ms: no more than 500 can arrive in the first
	// half second (none is sent early); fewer than 400 would be a
	// generator far behind its schedule.
	early := 0
	for _, a := range arrivals {
		if a.Before(o.start.Add(500 * time.Millisecond)) {
			early++
		}
	}
	if early > 500 || early < 400 {
		t.Errorf("%d of 1000 arrived in the first half second, want 400 to 500", early)
	}
	if last := arrivals[len(arrivals)-1]; last.Before(o.start.Add(999 * time.Millisecond)) {
		t.Errorf("the last request arrived %v after the start, before it was due (999 ms)", last.Sub(o.start))
	}
	if rep.Achieved < 900 || rep.Achieved > 1001 {
		t.Errorf("achieved %.0f/s, want about 1000", rep.Achieved)
	}
}

// TestErrorsCountedApart: a server that drops every tenth request's
// connection without answering: those are errors with no latency, and the
// generator dials again for the next request.
func TestErrorsCountedApart(t *testing.T) {
	u := serve(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "Bearer x" {
			c, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				c.Close()
			}
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	tokens := []string{"a", "a", "a", "a", "a", "a", "a", "a", "a", "x"}
	o := runPlan(t, newPlan(u, 500, 0, time.Second, 4, tokens...))
	if o.statuses[200] != 450 || o.errors["closed"] != 50 || len(o.latencies) != 450 || o.sent != 500 {
		t.Errorf("statuses %v errors %v answered %d sent %d, want 450 200s and 50 closed of 500 sent",
			o.statuses, o.errors, len(o.latencies), o.sent)
	}
}

// TestTimeoutsAndBodiesToTheClose: a request unanswered past the timeout
// is an error and its connection is dialed again; an answer without a
// length ends when the server closes and is counted.
func TestTimeoutsAndBodiesToTheClose(t *testing.T) {
	u := serve(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.Header.Get("Authorization") {
		case "Bearer slow":
			time.Sleep(time.Second)
		case "Bearer raw":
			c, rw, err := http.NewResponseController(w).Hijack()
			if err == nil {
				rw.WriteString("HTTP/1.1 202 Accepted\r\n\r\nthe body, to the close")
				rw.Flush()
				c.Close()
			}
		}
	})
	p := newPlan(u, 100, 0, time.Second, 8, "a", "slow", "raw", "a")
	p.timeout = 300 * time.Millisecond
	o := runPlan(t, p)
	if o.errors["timeout"] != 25 || o.statuses[200] != 50 || o.statuses[202] != 25 || o.sent != 100 {
		t.Errorf("statuses %v errors %v sent %d; want 50 200s, 25 202s and 25 timeouts of 100 sent", o.statuses, o.errors, o.sent)
	}
	// The timeouts are in the tail, at the time they were given up: the
	// slowest quarter waited at least the timeout.
	if n := len(o.latencies); n != 100 || o.latencies[n-25] < p.timeout {
		t.Errorf("%d latencies, the 76th %v; want 100, the slowest 25 at least %v", n, o.latencies[max(n-25, 0)], p.timeout)
	}
}

// TestLargeBodiesAndIdleCloses: a body larger than the socket takes at
// once is written in pieces as the socket drains, and connections the
// server closes while idle are dialed again for the next request, not
// counted as errors.
func TestLargeBodiesAndIdleCloses(t *testing.T) {
	const size = 8 << 20
	var mu sync.Mutex
	bodies := 0
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		if n != size {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		mu.Lock()
		bodies++
		mu.Unlock()
	}))
	srv.Config.IdleTimeout = 30 * time.Millisecond // shorter than a connection waits between requests
	srv.Start()
	t.Cleanup(srv.Close)
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	p := newPlan(u, 10, 0, time.Second, 2)
	p.requests = render("POST", u, nil, bytes.Repeat([]byte("x"), size), nil)
	o := runPlan(t, p)
	mu.Lock()
	defer mu.Unlock()
	if o.statuses[200] != 10 || len(o.errors) != 0 || bodies != 10 {
		t.Errorf("statuses %v errors %v, %d whole bodies; want 10 answered 200, each body whole", o.statuses, o.errors, bodies)
	}
}

// TestUniqueTokens: with -unique every request carries a token of its
// own, and a file too short for the run is refused before anything is
// sent.
func TestUniqueTokens(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]int{}
	u := serve(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.Header.Get("Authorization")]++
		mu.Unlock()
	})
	dir := t.TempDir()
	write := func(name string, n int) string {
		var b strings.Builder
		for i := range n {
			b.WriteString("user" + strings.Repeat("x", i) + "\n")
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	base := []string{"-url", u.String() + "/seckill/1", "-method", "POST", "-rate", "200", "-warmup", "100ms", "-duration", "200ms", "-unique"}

	var out bytes.Buffer
	if err := run(context.Background(), append(base, "-tokens", write("short.txt", 59)), &out); err == nil || !strings.Contains(err.Error(), "59 tokens") {
		t.Errorf("59 tokens for 60 requests: err %v, want a refusal", err)
	}
	if err := run(context.Background(), append(base, "-tokens", write("enough.txt", 60)), &out); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 60 {
		t.Errorf("%d distinct tokens arrived, want 60", len(seen))
	}
	for tok, n := range seen {
		if n != 1 {
			t.Errorf("%s sent %d times", tok, n)
		}
	}
}

// TestRunJSON: the command end to end: method, headers, body and path
// reach the server as given, and the JSON report has the counts.
func TestRunJSON(t *testing.T) {
	u := serve(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Method != "PUT" || r.URL.Path != "/v/7" || r.URL.RawQuery != "q=1" ||
			r.Header.Get("X-Test") != "yes" || string(body) != `{"a":1}` {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, strings.Repeat("x", 5000))
	})
	var out bytes.Buffer
	err := run(context.Background(), []string{"-url", u.String() + "/v/7?q=1", "-method", "put", "-H", "X-Test: yes",
		"-body", `{"a":1}`, "-rate", "100", "-warmup", "0s", "-duration", "500ms", "-conns", "2", "-json"}, &out)
	if err != nil {
		t.Fatal(err)
	}
	var rep report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("%v: %s", err, out.Bytes())
	}
	if rep.Due != 50 || rep.Sent != 50 || rep.Answered != 50 || rep.Statuses["202"] != 50 || rep.Method != "PUT" {
		t.Errorf("report %+v, want 50 due, sent and answered 202", rep)
	}
	if rep.Latency.P50 <= 0 || rep.Latency.P50 > rep.Latency.P99 || rep.Latency.P99 > rep.Latency.Max {
		t.Errorf("latencies %+v out of order", rep.Latency)
	}
	if line := rep.line(); !strings.Contains(line, "statuses 202:50;") {
		t.Errorf("line %q does not count 202:50", line)
	}
}

func TestPercentileNearestRank(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 1000; i++ {
		d = append(d, time.Duration(i))
	}
	for _, tc := range []struct {
		q    float64
		want time.Duration
	}{{50, 500}, {90, 900}, {99, 990}, {99.9, 999}, {100, 1000}, {0.01, 1}} {
		if got := percentile(d, tc.q); got != tc.want {
			t.Errorf("p%v of 1..1000 = %v, want %v", tc.q, got, tc.want)
		}
	}
	if got := percentile(d[:3], 99.9); got != 3 {
		t.Errorf("p99.9 of three = %v, want the largest", got)
	}
}
