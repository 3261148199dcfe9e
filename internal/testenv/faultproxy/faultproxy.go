// Package faultproxy is a TCP proxy that breaks the network on purpose, for
// tests that run the seckill server against a real MariaDB and Redis.
//
// A flash sale is judged by what it does when the network misbehaves: Redis
// stops answering halfway through the stock script, the reply to a COMMIT
// never comes back, every query is slow for a second. A mock cannot say
// what a real driver does then; a proxy between the real client and the
// real server can. A test points the DSN or REDIS_ADDR at Proxy.Addr and,
// while the sale runs, calls:
//
//   - Cut: every connection is reset now, and new ones are reset as they
//     arrive, as when the server's host dies.
//   - Blackhole: connections stay open but nothing gets through either way,
//     as in a network partition; clients learn of it only from their own
//     timeouts.
//   - Latency: every chunk waits before it is forwarded.
//   - Heal: back to normal.
//   - DropReplyAfter: the matched request reaches the server and runs, but
//     its reply never reaches the client, whose connection is reset. This is
//     the fault that tells "failed" from "unknown": the client sees an error
//     for work that was done, so "a failed commit is never success" has a
//     twin, "a failed commit is not proof of failure".
//
// The proxy forwards bytes as it reads them (a "chunk" is what one Read
// returned, at most 32 KiB) and does not understand them. Only the matchers
// given to DropReplyAfter look inside; MySQLQuery, RedisCommand and
// RedisScript are ready-made ones.
package faultproxy

import (
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy forwards the connections it accepts on Addr to one upstream address,
// and injects the faults its methods name. Its methods are safe to call from
// any goroutine.
type Proxy struct {
	upstream string
	ln       net.Listener
	wg       sync.WaitGroup // the accept loop and one serve per connection

	mu       sync.Mutex
	mode     mode
	latency  time.Duration
	conns    map[*conn]struct{}
	drops    []*drop
	accepted int
	refused  int
	closed   bool
}

type mode int

const (
	normal mode = iota
	cut
	blackhole
)

// Stats counts the proxy's connections.
type Stats struct {
	Accepted int // connections accepted since Start, Refused ones included
	Refused  int // connections reset on arrival during a Cut
	Open     int // connections open now
}

// chunkSize bounds one Read, so a chunk is never more than this. Hundreds of
// connections hold two buffers each; 32 KiB keeps that at a few MiB while
// every request of the seckill server fits in one chunk.
const chunkSize = 32 << 10

// dialTimeout bounds the dial to the upstream. A refused dial fails at once
// on loopback; the bound matters for an upstream that is itself stuck.
const dialTimeout = 5 * time.Second

// Start starts a proxy on 127.0.0.1 to upstream (host:port), and closes it
// when the test ends.
func Start(t testing.TB, upstream string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("faultproxy: listen: %v", err)
	}
	p := &Proxy{upstream: upstream, ln: ln, conns: make(map[*conn]struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr returns the proxy's address (127.0.0.1:port), for a DSN or REDIS_ADDR.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut resets every open connection now, and resets new ones as soon as they
// are accepted, until Heal. The listener stays open, so a client sees
// "connection reset" (or EOF) rather than "connection refused"; both are
// what a driver sees when the server's host goes away.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.mode = cut
	open := p.takeConns(nil)
	p.mu.Unlock()
	for _, c := range open {
		c.close(true)
	}
}

// Blackhole keeps every connection open but forwards nothing more in either
// direction: bytes read from either side are held, not delivered. New
// connections are accepted and stay silent too (the upstream is not even
// dialled, so a MySQL client never gets its greeting). Clients notice only
// through their own timeouts, which is the point: a client without timeouts
// hangs here, as it would in a real partition.
//
// Every connection open during a Blackhole is closed at Heal, and the bytes
// it held are dropped: a partition that ends leaves broken connections
// behind, and delivering a held request late would make the test depend on
// how long the partition lasted.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = blackhole
	for c := range p.conns {
		c.partitioned = true
	}
}

// Latency delays every chunk by d before it is forwarded, in each direction,
// so a request and its reply take at least 2*d more. A chunk waits before
// the next one is read, so a connection also moves at most one chunk per d
// each way; for request/reply protocols such as MySQL and Redis that is the
// same thing. Zero removes the delay.
func (p *Proxy) Latency(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency = d
}

// Heal ends Cut, Blackhole and Latency: new connections are forwarded again.
// Connections open during a Blackhole are reset now (see Blackhole).
// Pending DropReplyAfter requests stay: they are one-shot requests, not a
// state of the network.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.mode = normal
	p.latency = 0
	partitioned := p.takeConns(func(c *conn) bool { return c.partitioned })
	p.mu.Unlock()
	for _, c := range partitioned {
		c.close(true)
	}
}

// DropReplyAfter arms a one-shot fault: the next client-to-server chunk for
// which match returns true, on any connection, is forwarded to the server,
// and then that connection is reset before the server's reply reaches the
// client. The returned channel is closed once the client's side has been
// reset (also when a Cut or Close came first, after the chunk was read).
//
// The server runs the request for real before the client's connection is
// reset: after the matched chunk the proxy half-closes its connection to the
// server, so nothing the client sends later is forwarded; it discards
// whatever the server answers, and waits for the server to close its side.
// MariaDB and Redis close only once they have run everything they read and
// written its reply, so a matched COMMIT has committed by the time the
// client sees its error, and a test may check the server at once. (A server
// that ignored the half-close would keep the client waiting until the test
// ends.) Requests that share the matched chunk, as in a pipeline, run too
// and lose their replies as well.
//
// match sees one chunk and must not keep it. A request split across two
// chunks cannot match; the matchers of this package only ever match whole
// requests (see MySQLQuery).
func (p *Proxy) DropReplyAfter(match func(request []byte) bool) <-chan struct{} {
	d := &drop{match: match, fired: make(chan struct{})}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drops = append(p.drops, d)
	return d.fired
}

// Stats returns the proxy's counters.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Stats{Accepted: p.accepted, Refused: p.refused, Open: len(p.conns)}
}

// Close stops the proxy: the listener and every connection are closed, and
// Close returns once all of the proxy's goroutines have. Start calls it when
// the test ends; calling it again does nothing.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	open := p.takeConns(nil)
	p.mu.Unlock()
	p.ln.Close()
	for _, c := range open {
		c.close(true)
	}
	p.wg.Wait()
}

// takeConns removes from the open connections, and returns, those for
// which keep is true (all of them when keep is nil), for the caller to close
// once it has released p.mu, which it holds now. They leave the map at once
// so that Stats counts them closed as soon as Cut or Heal returns.
func (p *Proxy) takeConns(keep func(*conn) bool) []*conn {
	var out []*conn
	for c := range p.conns {
		if keep == nil || keep(c) {
			out = append(out, c)
			delete(p.conns, c)
		}
	}
	return out
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		nc, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors or the like: keep serving the
			// connections we have, and try again shortly.
			time.Sleep(10 * time.Millisecond)
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			reset(nc)
			continue
		}
		p.accepted++
		if p.mode == cut {
			p.refused++
			p.mu.Unlock()
			reset(nc)
			continue
		}
		ctx, cancel := context.WithCancel(context.Background())
		c := &conn{p: p, client: nc, ctx: ctx, cancel: cancel, partitioned: p.mode == blackhole}
		p.conns[c] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go c.serve()
	}
}

// claimDrop returns the pending drop that matches chunk, now claimed and
// removed, or nil. match runs without p.mu held, so a matcher may be slow
// or call the proxy without deadlocking it.
func (p *Proxy) claimDrop(chunk []byte) *drop {
	p.mu.Lock()
	pending := slices.Clone(p.drops)
	p.mu.Unlock()
	for _, d := range pending {
		if d.match(chunk) && d.claimed.CompareAndSwap(false, true) {
			p.mu.Lock()
			p.drops = slices.DeleteFunc(p.drops, func(x *drop) bool { return x == d })
			p.mu.Unlock()
			return d
		}
	}
	return nil
}

type drop struct {
	match   func([]byte) bool
	claimed atomic.Bool
	fired   chan struct{}
}

// conn is one client connection and, once dialled, its upstream.
type conn struct {
	p      *Proxy
	client net.Conn
	ctx    context.Context // done once the conn is closed
	cancel context.CancelFunc

	// partitioned is guarded by p.mu: set on every conn open during a
	// Blackhole, which never forwards another byte and is closed at Heal.
	partitioned bool

	// dropping is set just before a matched request is forwarded: from
	// then on everything the server sends is discarded.
	dropping atomic.Pointer[drop]

	mu     sync.Mutex
	server net.Conn
	closed bool
}

func (c *conn) serve() {
	defer func() {
		c.p.mu.Lock()
		delete(c.p.conns, c)
		c.p.mu.Unlock()
		c.p.wg.Done()
	}()
	if !c.hold() {
		return
	}
	d := net.Dialer{Timeout: dialTimeout}
	server, err := d.DialContext(c.ctx, "tcp", c.p.upstream)
	if err != nil {
		c.close(true)
		return
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		reset(server)
		return
	}
	c.server = server
	c.mu.Unlock()

	up := make(chan struct{})
	go func() {
		defer close(up)
		c.toServer(server)
	}()
	c.toClient(server)
	<-up
}

// toServer forwards the client's chunks to the server.
func (c *conn) toServer(server net.Conn) {
	buf := make([]byte, chunkSize)
	for {
		n, err := c.client.Read(buf)
		if n > 0 {
			if !c.delay() {
				return
			}
			d := c.p.claimDrop(buf[:n])
			if d != nil {
				c.dropping.Store(d)
			}
			if _, err := server.Write(buf[:n]); err != nil {
				c.close(true)
				return
			}
			if d != nil {
				// No request may follow the matched one: half-close, so
				// the server runs what it has read, replies into
				// toClient's discard, and then closes its side.
				if tc, ok := server.(*net.TCPConn); ok {
					tc.CloseWrite()
				}
				return
			}
		}
		if err != nil {
			c.close(!errors.Is(err, io.EOF))
			return
		}
	}
}

// toClient forwards the server's chunks to the client, or discards them all
// once a drop has been armed on this connection.
func (c *conn) toClient(server net.Conn) {
	buf := make([]byte, chunkSize)
	for {
		n, err := server.Read(buf)
		if d := c.dropping.Load(); d != nil {
			if err == nil {
				continue
			}
			// The server has closed its side (or the proxy this conn):
			// the request has run, its reply is gone. Now the client.
			c.close(true)
			close(d.fired)
			return
		}
		if n > 0 {
			if !c.delay() {
				return
			}
			if _, err := c.client.Write(buf[:n]); err != nil {
				c.close(true)
				return
			}
		}
		if err != nil {
			c.close(!errors.Is(err, io.EOF))
			return
		}
	}
}

// delay waits out the latency and any blackhole before a chunk is
// forwarded. It reports false when the conn was closed meanwhile, and the
// chunk must be dropped.
func (c *conn) delay() bool {
	c.p.mu.Lock()
	d := c.p.latency
	c.p.mu.Unlock()
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-c.ctx.Done():
			return false
		}
	}
	return c.hold()
}

// hold returns at once, true, unless the conn is partitioned. A partitioned
// conn is closed at Heal without forwarding anything more, so hold waits
// for that and reports false.
func (c *conn) hold() bool {
	c.p.mu.Lock()
	partitioned := c.partitioned
	c.p.mu.Unlock()
	if !partitioned {
		return true
	}
	<-c.ctx.Done()
	return false
}

// close closes both sides, once. With abort it resets them (RST), as a
// failing network would; without, it closes them normally, passing on an
// orderly close by one side.
func (c *conn) close(abort bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.closed = true
	c.cancel()
	for _, nc := range []net.Conn{c.client, c.server} {
		switch {
		case nc == nil:
		case abort:
			reset(nc)
		default:
			nc.Close()
		}
	}
}

// reset closes nc with an RST rather than a FIN, so its peer fails at once
// with "connection reset" instead of reading an orderly EOF.
func reset(nc net.Conn) {
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	nc.Close()
}
