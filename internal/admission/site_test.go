package admission

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"seckill/internal/web"
)

// A flood from every /64 of one IPv6 /48 is one site's: it holds the
// site's share of the slots (half, alone), not a newcomer's slot per /64,
// and another client is served. Shared by /64, the 40 /64s below took
// all 16 slots and the other client was told 429.
func TestCapSharesBySite(t *testing.T) {
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
	for i := range 40 {
		wg.Go(func() {
			w := httptest.NewRecorder()
			req := httptest.NewRequest("GET", "/slow", nil)
			req.RemoteAddr = fmt.Sprintf("[2001:db8:1:%x::7]:999", i) // a /64 of its own, all in 2001:db8:1::/48
			r.ServeHTTP(w, req)
			codes <- w.Code
		})
	}
	// Whatever fails, the flood's requests end (else the test would wait
	// for them for ever).
	defer wg.Wait()
	var once sync.Once
	end := func() { once.Do(func() { close(release) }) }
	defer end()
	for i := range 40 - 8 {
		select {
		case c := <-codes:
			if c != http.StatusTooManyRequests {
				t.Fatalf("flood: %d before release, want 429 (the site's share is 8 of 16)", c)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("flood: %d requests refused, want 32: the site's /64s took more than its share of 8", i)
		}
	}
	for _, other := range []string{"203.0.113.9:1", "[2001:db8:2::1]:1"} {
		w := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "/fast", nil)
		req.RemoteAddr = other
		r.ServeHTTP(w, req)
		if w.Code != http.StatusOK {
			t.Errorf("%s during a /48's flood: %d, want 200", other, w.Code)
		}
	}
	end()
	wg.Wait()
	if len(cp.sites)+len(cp.addrs)+len(cp.width) != 0 || cp.total != 0 {
		t.Fatalf("after every slot is given back: %d held by %v %v %v", cp.total, cp.sites, cp.addrs, cp.width)
	}
}

// Within its site's share, a site's /64s share it as sites share the
// cap: a /64 holding some holds at most the site's share divided among
// the site's /64s holding any. IPv4 addresses are sites of their own.
func TestCapSharesWithinASite(t *testing.T) {
	cp := NewCap(16)
	take := func(addr string, n int) int { return takeN(cp, addr, n) }
	if got := take("198.51.100.1", 16); got != 8 {
		t.Fatalf("a lone IPv4 address took %d of 16, want 8 (half)", got)
	}
	a, b, c := "2001:db8:1:a::1", "2001:db8:1:b::1", "2001:db8:1:c::1"
	if got := take(a, 2); got != 2 {
		t.Fatalf("the site's first /64 took %d, want 2", got)
	}
	if got := take(b, 1); got != 1 {
		t.Fatalf("the site's second /64, a newcomer, took %d, want 1", got)
	}
	// The site's share is 16/2 shared by 2 sites = 4, by its 2 /64s: 2.
	if got := take(a, 4); got != 0 {
		t.Fatalf("a /64 at its part of the site's share took %d more, want 0", got)
	}
	if got := take(b, 4); got != 1 {
		t.Fatalf("the other /64 took %d more, want 1 (up to 2)", got)
	}
	if got := take(c, 1); got != 0 {
		t.Fatalf("a third /64 of a site at its share took %d, want 0", got)
	}
	if got := take("2001:db8:1:a::99", 1); got != 0 {
		t.Fatalf("another address of /64 a took %d, want 0 (a /64 is one address)", got)
	}
	if got := take("198.51.100.2", 1); got != 1 {
		t.Fatalf("another IPv4 address, a newcomer, took %d, want 1", got)
	}
	for addr, n := range map[string]int{"198.51.100.1": 8, a: 2, b: 2, "198.51.100.2": 1} {
		for range n {
			cp.give(sharesOf(addr))
		}
	}
	if len(cp.sites)+len(cp.addrs)+len(cp.width) != 0 || cp.total != 0 {
		t.Fatalf("after every slot is given back: %d held by %v %v %v", cp.total, cp.sites, cp.addrs, cp.width)
	}
}

// pipeListener is a Listener whose connections come from dial, each
// with the remote address it is given.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

type addrConn struct {
	net.Conn
	remote net.Addr
}

func (c addrConn) RemoteAddr() net.Addr { return c.remote }

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error   { l.once.Do(func() { close(l.done) }); return nil }
func (l *pipeListener) Addr() net.Addr { return &net.TCPAddr{} }

// dial hands the listener a connection from addr, and returns the
// client's end.
func (l *pipeListener) dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	server, client := net.Pipe()
	t.Cleanup(func() { client.Close(); server.Close() })
	l.conns <- addrConn{Conn: server, remote: net.TCPAddrFromAddrPort(netip.MustParseAddrPort(addr))}
	return client
}

// One IPv6 /48 holds at most perSite connections over all its /64s, each
// of which holds at most perAddr; closing one gives the site its place
// back; IPv4 addresses and the trusted proxies are not counted by site.
func TestConnsPerSite(t *testing.T) {
	ln := newPipeListener()
	cs := NewConns(2, 3, []netip.Prefix{netip.MustParsePrefix("2001:db8:1:ff::/64")})
	capped := cs.Listener(ln)
	defer capped.Close()
	accepted := acceptAll(capped)
	// connect reports whether a connection from addr was accepted (or
	// refused: closed, and counted).
	connect := func(addr string) (net.Conn, bool) {
		t.Helper()
		before := cs.Refused()
		ln.dial(t, addr)
		deadline := time.After(5 * time.Second)
		for {
			select {
			case c := <-accepted:
				return c, true
			case <-deadline:
				t.Fatalf("a connection from %s was neither accepted nor refused", addr)
			case <-time.After(time.Millisecond):
				if cs.Refused() > before {
					return nil, false
				}
			}
		}
	}
	open := map[string]net.Conn{}
	for _, step := range []struct {
		addr string
		ok   bool
	}{
		{"[2001:db8:1:1::1]:1", true},
		{"[2001:db8:1:1::2]:1", true},
		{"[2001:db8:1:1::3]:1", false}, // a third of its /64's
		{"[2001:db8:1:2::1]:1", true},  // the site's third
		{"[2001:db8:1:3::1]:1", false}, // the site's fourth, from a fresh /64
		{"[2001:db8:1:ff::1]:1", true}, // a trusted proxy in the site
		{"[2001:db8:2::1]:1", true},    // another site
		{"192.0.2.1:1", true},
		{"192.0.2.1:2", true},
		{"192.0.2.1:3", false}, // IPv4: per address only
		{"192.0.2.2:1", true},
	} {
		c, ok := connect(step.addr)
		if ok != step.ok {
			t.Fatalf("a connection from %s: accepted %v, want %v", step.addr, ok, step.ok)
		}
		open[step.addr] = c
	}
	if cs.Refused() != 3 {
		t.Fatalf("Refused = %d, want 3", cs.Refused())
	}
	// Closing one of the site's connections gives the site a place, to
	// any of its /64s.
	open["[2001:db8:1:2::1]:1"].Close()
	if _, ok := connect("[2001:db8:1:3::1]:1"); !ok {
		t.Fatal("a closed connection did not give its site's place back")
	}
	if _, ok := connect("[2001:db8:1:4::1]:1"); ok {
		t.Fatal("the site took a fourth connection")
	}
}
