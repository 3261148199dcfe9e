package live

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"seckill/internal/stock"
	"seckill/internal/testenv"
	"seckill/internal/voucher"
)

// liveServer serves a Handler on the real MySQL and Redis, with a voucher
// on sale; reads counts the handler's reads of the sale's figures.
type liveServer struct {
	h       *Handler
	url     string
	voucher string
	reads   *atomic.Int64
}

func newLiveServer(t *testing.T, maxStreams int) liveServer {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	db := testenv.Open(t, testenv.MySQLDSN(t))
	rdb := testenv.Redis(t, 0)
	stocks := stock.NewStore(rdb, 15*time.Second)
	vouchers := voucher.NewService(db, stocks, nil, nil, time.Now, log)
	title, n := "Live test", int64(10)
	begin, end := time.Now().Add(-time.Minute), time.Now().Add(time.Hour)
	v, err := vouchers.Create(context.Background(), 0, "", voucher.CreateInput{Title: &title, Stock: &n, BeginTime: &begin, EndTime: &end})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	h := NewHandler(NewSource(db, rdb, vouchers, stocks, nil, time.Now), nil, done, log)
	h.feeds.max = maxStreams
	reads := &atomic.Int64{}
	read := h.feeds.read
	h.feeds.read = func(ctx context.Context, id int64) (Figures, error) {
		reads.Add(1)
		return read(ctx, id)
	}
	gin.SetMode(gin.TestMode)
	r := gin.New()
	r.GET("/live/:voucherId", h.Page)
	r.GET("/live/:voucherId/events", h.Events)
	r.POST("/live/:voucherId/crowd", h.StartCrowd)
	srv := httptest.NewServer(r)
	t.Cleanup(func() {
		close(done)
		srv.Close()
		h.feeds.wg.Wait() // every reader stopped: none is left behind
	})
	return liveServer{h: h, url: srv.URL, voucher: v.ID, reads: reads}
}

// stream is one open event stream.
type stream struct {
	events chan Figures // each figures event
	close  func()
}

// openStream opens an event stream; a refusal is returned, not a failure.
func openStream(t *testing.T, url string) (*stream, *http.Response) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		cancel()
		return nil, resp
	}
	s := &stream{events: make(chan Figures, 100)}
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(s.events)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				var f Figures
				if json.Unmarshal([]byte(data), &f) == nil {
					select {
					case s.events <- f:
					default:
					}
				}
			}
		}
	})
	s.close = func() { cancel(); resp.Body.Close(); wg.Wait() }
	t.Cleanup(s.close)
	return s, resp
}

// next waits for the stream's next figures.
func (s *stream) next(t *testing.T) Figures {
	t.Helper()
	select {
	case f, ok := <-s.events:
		if !ok {
			t.Fatal("the stream ended")
		}
		return f
	case <-time.After(10 * time.Second):
		t.Fatal("no event in 10s")
	}
	return Figures{}
}

// Many streams of one voucher share one reader: the figures are read once
// a second, not once a second per stream. Streams beyond the cap are
// refused with 429 busy, Retry-After and the error envelope, until one
// leaves; when the last leaves, the reader stops.
func TestEventsShareOneReaderUnderACap(t *testing.T) {
	const streams = 5
	ls := newLiveServer(t, streams)
	events := ls.url + "/live/" + ls.voucher + "/events"

	start := time.Now() // the reader starts with the first stream
	var open []*stream
	for range streams {
		s, resp := openStream(t, events)
		if s == nil {
			t.Fatalf("stream refused: %d", resp.StatusCode)
		}
		open = append(open, s)
	}
	const rounds = 3
	for range rounds {
		for _, s := range open {
			if f := s.next(t); f.Voucher != ls.voucher || f.Initial != 10 {
				t.Fatalf("figures of the wrong sale: %+v", f)
			}
		}
	}
	// One read a second, and one at the start; a stream of its own each
	// would be streams times that.
	took := time.Since(start)
	if reads, most := ls.reads.Load(), int64(took/time.Second)+2; reads > most {
		t.Errorf("%d reads in %s for %d streams, want at most %d: one a second, whatever the streams", reads, took.Round(time.Millisecond), streams, most)
	}

	s, resp := openStream(t, events)
	if s != nil {
		t.Fatalf("stream %d of a cap of %d was let in", streams+1, streams)
	}
	var body struct {
		Error struct{ Code, Message string }
	}
	json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || body.Error.Code != "busy" || resp.Header.Get("Retry-After") != strconv.Itoa(int(streamsRetry/time.Second)) {
		t.Errorf("over the cap: %d, Retry-After %q, %+v; want 429 busy with Retry-After %d",
			resp.StatusCode, resp.Header.Get("Retry-After"), body, int(streamsRetry/time.Second))
	}
	// The page and the crowd are not streams: the cap does not touch them.
	if resp, err := http.Get(ls.url + "/live/" + ls.voucher); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("the page at the streams' cap: %v %v, want 200", resp.StatusCode, err)
	} else {
		resp.Body.Close()
	}

	open[0].close()
	waitFor(t, "the stream left to free its slot", func() bool { return streamsOpen(ls.h) == streams-1 })
	s, resp = openStream(t, events)
	if s == nil {
		t.Fatalf("a stream after one left: %d, want 200", resp.StatusCode)
	}
	s.next(t)
	open[0] = s

	for _, s := range open {
		s.close()
	}
	waitFor(t, "the last stream left", func() bool { return streamsOpen(ls.h) == 0 })
	stopped := make(chan struct{})
	go func() { ls.h.feeds.wg.Wait(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("the reader goes on after its last stream left")
	}
	after := ls.reads.Load()
	time.Sleep(1500 * time.Millisecond)
	if n := ls.reads.Load(); n != after {
		t.Errorf("%d reads with no stream open", n-after)
	}
}

func streamsOpen(h *Handler) int {
	h.feeds.mu.Lock()
	defer h.feeds.mu.Unlock()
	return h.feeds.open
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 10s: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// One client address may hold MaxStreamsPerClient streams, not every
// stream of the instance: the next viewer from elsewhere is let in.
func TestEventsCapPerClient(t *testing.T) {
	ls := newLiveServer(t, 100)
	ls.h.feeds.perClient = 2
	events := ls.url + "/live/" + ls.voucher + "/events"
	from := func(addr string) (*stream, *http.Response) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, events, nil)
		// The test's engine trusts every proxy (gin's default), so this
		// names the client.
		req.Header.Set("X-Forwarded-For", addr)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		t.Cleanup(func() { cancel(); resp.Body.Close() })
		if resp.StatusCode != http.StatusOK {
			return nil, resp
		}
		return &stream{}, resp
	}
	for range 2 {
		if s, resp := from("198.51.100.1"); s == nil {
			t.Fatalf("stream within the client's cap: %d", resp.StatusCode)
		}
	}
	s, resp := from("198.51.100.1")
	if s != nil {
		t.Fatal("a third stream from a client capped at 2 was let in")
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(string(body), ErrTooManyYours.Message) {
		t.Errorf("over the client's cap: %d %s, want 429 %q", resp.StatusCode, body, ErrTooManyYours.Message)
	}
	if s, resp := from("203.0.113.5"); s == nil {
		t.Fatalf("another client while the first is at its cap: %d, want 200", resp.StatusCode)
	}
}

// A sale that ends while its page is open sends its last figures, marked
// ended, and the stream closes; its reader stops with it. A page opened
// on a sale that has ended gets one event and costs one read, not a
// reader.
func TestEventsEndWithTheSale(t *testing.T) {
	ls := newLiveServer(t, 100)
	title, n := "Ends soon", int64(3)
	begin, end := time.Now().Add(-time.Minute), time.Now().Add(2*time.Second)
	v, err := ls.h.src.vouchers.Create(context.Background(), 0, "", voucher.CreateInput{Title: &title, Stock: &n, BeginTime: &begin, EndTime: &end})
	if err != nil {
		t.Fatal(err)
	}
	events := ls.url + "/live/" + v.ID + "/events"
	s, resp := openStream(t, events)
	if s == nil {
		t.Fatalf("stream refused: %d", resp.StatusCode)
	}
	if f := s.next(t); f.Ended {
		t.Fatalf("figures before the end say ended: %+v", f)
	}
	ended := false
	deadline := time.After(15 * time.Second)
	for !ended {
		select {
		case f, ok := <-s.events:
			if !ok {
				t.Fatal("the stream closed before its ended figures")
			}
			ended = f.Ended
		case <-deadline:
			t.Fatal("no ended figures 13 s after the sale's end")
		}
	}
	select {
	case _, ok := <-s.events:
		for ok {
			_, ok = <-s.events // the ended marker's empty data, then the close
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stream stays open after the sale ended")
	}
	stopped := make(chan struct{})
	go func() { ls.h.feeds.wg.Wait(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the reader goes on after the sale ended")
	}

	before := ls.reads.Load()
	s, resp = openStream(t, events)
	if s == nil {
		t.Fatalf("stream of an ended sale refused: %d", resp.StatusCode)
	}
	if f := s.next(t); !f.Ended || f.Initial != 3 {
		t.Fatalf("an ended sale's stream: %+v, want its figures, ended", f)
	}
	waitFor(t, "the ended sale's stream to close", func() bool { return streamsOpen(ls.h) == 0 })
	// Within endedFor of the end, the last event is kept: no read at
	// all, however many times the page is opened.
	for range 5 {
		s, resp = openStream(t, events)
		if s == nil {
			t.Fatalf("stream of an ended sale refused: %d", resp.StatusCode)
		}
		if f := s.next(t); !f.Ended {
			t.Fatalf("an ended sale's stream: %+v, want its figures, ended", f)
		}
	}
	waitFor(t, "the ended sale's streams to close", func() bool { return streamsOpen(ls.h) == 0 })
	if reads := ls.reads.Load() - before; reads != 0 {
		t.Errorf("opening an ended sale's page 6 times read its figures %d times, want 0 (its last event is kept)", reads)
	}
}

// openFrom opens an event stream as client addr (the test's engine trusts
// every proxy, gin's default, so X-Forwarded-For names the client); a
// refusal is returned, not a failure.
func openFrom(t *testing.T, url, addr string) (*stream, *http.Response) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	req.Header.Set("X-Forwarded-For", addr)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		cancel()
		return nil, resp
	}
	s := &stream{close: func() { cancel(); resp.Body.Close() }}
	t.Cleanup(s.close)
	return s, resp
}

// Streams that come and go, one after another and never two at once, as
// the probe's churn opened them (issue 35), cost a read a second, not a
// read each: a voucher's reader outlives its last stream by a second, and
// serves the next stream the event it has. Each stream here comes from
// another address, so that no limit per address hides the reads: the
// bound holds whoever asks.
func TestEventsChurnReadsOnceASecond(t *testing.T) {
	ls := newLiveServer(t, 100)
	events := ls.url + "/live/" + ls.voucher + "/events"
	start := time.Now()
	opened := 0
	for time.Since(start) < 3*time.Second {
		opened++
		s, resp := openFrom(t, events, "198.51.100."+strconv.Itoa(opened%250+1))
		if s == nil {
			t.Fatalf("stream %d refused: %d", opened, resp.StatusCode)
		}
		s.close()
		waitFor(t, "the stream to leave", func() bool { return streamsOpen(ls.h) == 0 })
	}
	took := time.Since(start)
	if reads, most := ls.reads.Load(), int64(took/time.Second)+1; reads > most {
		t.Errorf("%d streams opened and closed one after another in %s read the figures %d times, want at most %d: once a second, however streams come and go",
			opened, took.Round(time.Millisecond), reads, most)
	}
	// And a stream that stays gets figures at once: the event the reader
	// has.
	s, resp := openStream(t, events)
	if s == nil {
		t.Fatalf("stream refused: %d", resp.StatusCode)
	}
	select {
	case f := <-s.events:
		if f.Voucher != ls.voucher {
			t.Errorf("figures of the wrong sale: %+v", f)
		}
	case <-time.After(300 * time.Millisecond):
		t.Error("a stream joining a lingering reader got no event at once")
	}
	t.Logf("%d streams in %s, %d reads", opened, took.Round(time.Millisecond), ls.reads.Load())
}

// One address opens streams at ClientOpenRate a second after a burst of
// ClientOpenBurst, however short-lived they are (the caps count the
// streams open at once, not how often they open): past it, 429 busy with
// Retry-After, before the voucher is even looked up. Another address is
// let in meanwhile.
func TestEventsOpenRatePerClient(t *testing.T) {
	ls := newLiveServer(t, 100)
	events := ls.url + "/live/" + ls.voucher + "/events"
	const addr = "198.51.100.7"
	var refused *http.Response
	for i := range 3 * MaxStreamsPerClient {
		s, resp := openFrom(t, events, addr)
		if s == nil {
			if i < MaxStreamsPerClient {
				t.Fatalf("open %d of a burst of %d refused: %d", i+1, MaxStreamsPerClient, resp.StatusCode)
			}
			refused = resp
			break
		}
		s.close()
		waitFor(t, "the stream to leave", func() bool { return streamsOpen(ls.h) == 0 })
	}
	if refused == nil {
		t.Fatalf("%d streams opened and closed at once from one address were all let in, want a limit on the rate", 3*MaxStreamsPerClient)
	}
	var body struct {
		Error struct{ Code, Message string }
	}
	json.NewDecoder(refused.Body).Decode(&body)
	refused.Body.Close()
	if refused.StatusCode != http.StatusTooManyRequests || body.Error.Code != "busy" || !strings.Contains(body.Error.Message, "too fast") || refused.Header.Get("Retry-After") == "" {
		t.Errorf("past the rate: %d %+v, Retry-After %q; want 429 busy, too fast, with Retry-After", refused.StatusCode, body, refused.Header.Get("Retry-After"))
	}
	// Refused before the lookup: an ID that is no voucher costs nothing
	// either, and answers the same.
	if _, resp := openFrom(t, ls.url+"/live/999999999999/events", addr); resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("an unknown voucher past the rate: %d, want 429", resp.StatusCode)
	}
	if s, resp := openFrom(t, events, "203.0.113.9"); s == nil {
		t.Errorf("another address while the first is past its rate: %d, want 200", resp.StatusCode)
	}
}
