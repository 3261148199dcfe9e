//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// A plan is one run: what to send, where, how fast and for how long.
type plan struct {
	addr string // host:port, dialed over TCP
	// requests[i % len(requests)] is request i, rendered whole: request
	// line, headers, body. With unique, request i is requests[i] and the
	// plan never has more requests than that.
	requests [][]byte
	head     bool // HEAD requests: the answers have no body

	rate     float64       // requests a second
	warmup   time.Duration // sent, never counted
	duration time.Duration // the measured window, after the warm-up
	conns    int           // keep-alive connections
	loops    int           // event loops (threads) the connections are shared among; 0: one
	timeout  time.Duration // the most a request may wait for its answer
	late     time.Duration // a request sent later than this after it was due is late
}

// count is how many requests the plan sends in all, warm-up included.
func (p *plan) count() int64 { return int64(p.rate * (p.warmup + p.duration).Seconds()) }

// firstMeasured is the index of the first request past the warm-up.
func (p *plan) firstMeasured() int64 { return int64(p.rate * p.warmup.Seconds()) }

// due is when request i should be sent: the schedule alone decides it,
// never the answers, which is what makes the load open-loop.
func (p *plan) due(start time.Time, i int64) time.Time {
	return start.Add(time.Duration(float64(i) * float64(time.Second) / p.rate))
}

// dueBy is how many requests are due by now: request i is due once
// i <= (now - start) * rate.
func (p *plan) dueBy(start, now time.Time) int64 {
	return int64(now.Sub(start).Seconds()*p.rate) + 1
}

// An outcome is what the requests past the warm-up met.
type outcome struct {
	start      time.Time       // the schedule's zero: request 0 was due then
	window     time.Time       // when the first measured request was due
	lastAnswer time.Time       // when the last measured answer was read
	latencies  []time.Duration // of every measured answer, from when it was due, and of each timed out or unsent request until it was given up; sorted
	lags       []time.Duration // of every measured request written, from due to the write; sorted
	statuses   map[int]int
	errors     map[string]int // by kind: no answer, so no latency
	sent       int            // measured requests written to a connection
	late       int            // of those, written more than plan.late after they were due
	queued     int            // of those, due while every connection of their loop was busy
	unsent     int            // measured requests never written: the run was stopped first
}

// tally is one loop's share of the outcome, merged at the end so that the
// loops share nothing but the next request's index.
type tally struct {
	latencies  []time.Duration
	lags       []time.Duration
	statuses   map[int]int
	errors     map[string]int
	sent, late int
	queued     int
	unsent     int
	lastAnswer time.Time
}

// run sends the plan's requests on their schedule and gathers what they
// met. Request i is due at start + i/rate. A connection free takes the
// next request due, writes it and waits for the answer; a request due
// while every connection still waits for an answer is taken by the first
// to be free, late, and is timed from when it was due all the same (wrk2's
// rule: a closed loop that times from the write leaves out exactly the
// waits a stalled server causes, "coordinated omission"). Nothing is sent
// after warm-up + duration + timeout, nor once ctx is done: what is left is
// unsent.
//
// The connections are non-blocking sockets served by event loops of
// their own (epoll, as wrk does), each on a thread while it waits: a
// goroutine a connection cost up to twice the CPU a request (a park and a
// wake-up in Go's scheduler for every answer, a thread woken for most), CPU
// that the server measured on the same two cores did not get. A loop
// sleeps in epoll_pwait2 until the next request is due or an answer
// comes, to the microsecond; Go's own timers wake an idle program only to
// the millisecond (epoll_wait's unit), which added up to a millisecond to
// every latency of a quiet run.
func (p *plan) run(ctx context.Context) (*outcome, error) {
	if p.rate <= 0 || p.conns <= 0 || len(p.requests) == 0 {
		return nil, errors.New("openloop: a plan needs a rate, connections and a request")
	}
	ta, err := net.ResolveTCPAddr("tcp", p.addr)
	if err != nil {
		return nil, err
	}
	loops := min(max(p.loops, 1), p.conns)
	ls := make([]*loop, loops)
	for k := range ls {
		l, err := p.newLoop(ta, p.conns/loops+btoi(k < p.conns%loops), (p.count()-p.firstMeasured())/int64(loops))
		if err != nil {
			for _, l := range ls[:k] {
				l.close()
			}
			return nil, err
		}
		ls[k] = l
	}

	total, first := p.count(), p.firstMeasured()
	start := time.Now()
	s := &schedule{p: p, start: start, stop: start.Add(p.warmup + p.duration + p.timeout), total: total, first: first}
	var wg sync.WaitGroup
	for _, l := range ls {
		wg.Go(func() { l.serve(ctx, s) })
	}
	wg.Wait()

	o := &outcome{start: start, window: p.due(start, first), statuses: map[int]int{}, errors: map[string]int{}}
	for _, l := range ls {
		t := &l.t
		o.latencies = append(o.latencies, t.latencies...)
		o.lags = append(o.lags, t.lags...)
		for s, n := range t.statuses {
			o.statuses[s] += n
		}
		for e, n := range t.errors {
			o.errors[e] += n
		}
		o.sent += t.sent
		o.late += t.late
		o.queued += t.queued
		o.unsent += t.unsent
		if t.lastAnswer.After(o.lastAnswer) {
			o.lastAnswer = t.lastAnswer
		}
	}
	slices.Sort(o.latencies)
	slices.Sort(o.lags)
	return o, nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// A schedule is the run's clock and its next request, shared by the loops.
type schedule struct {
	p            *plan
	start, stop  time.Time
	total, first int64
	next         atomic.Int64 // the next request no loop has taken
}

// take takes the next request if it is due by now.
func (s *schedule) take(now time.Time) (int64, bool) {
	due := min(s.total, s.p.dueBy(s.start, now))
	for {
		i := s.next.Load()
		if i >= due {
			return 0, false
		}
		if s.next.CompareAndSwap(i, i+1) {
			return i, true
		}
	}
}

// abandon takes every request left and tells how many of them were
// measured: the run stopped before they were sent.
func (s *schedule) abandon() (from, to int64) {
	i := s.next.Swap(s.total)
	return min(max(i, s.first), s.total), s.total
}

// A loop is one thread's connections and its epoll instance.
type loop struct {
	p     *plan
	addr  *net.TCPAddr
	epfd  int
	conns []*conn
	idle  []*conn // free: no request in flight
	busy  int     // requests in flight
	// unblocked is when a connection was last freed while none was: a
	// request due before it waited for a connection.
	unblocked time.Time
	t         tally
}

// A conn is one keep-alive connection of a loop.
type conn struct {
	id   int // its index in loop.conns, the epoll event's tag
	fd   int // -1: closed, dialed again when next needed
	buf  []byte
	i    int64 // the request in flight, -1 none
	due  time.Time
	sent time.Time
	out  []byte // the part of the request the socket did not take yet
	// outArmed: the epoll set asks for EPOLLOUT on this socket (a write
	// that the socket did not take whole), to be taken back once written.
	outArmed bool
	// toClose: the answer's head is read and its body runs to the
	// connection's end.
	toClose bool
	status  int
}

// newLoop dials n connections for a loop that will answer about measured
// requests.
func (p *plan) newLoop(addr *net.TCPAddr, n int, measured int64) (*loop, error) {
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll: %w", err)
	}
	l := &loop{p: p, addr: addr, epfd: epfd}
	l.t.statuses, l.t.errors = map[int]int{}, map[string]int{}
	l.t.latencies = make([]time.Duration, 0, measured+16)
	l.t.lags = make([]time.Duration, 0, measured+16)
	for id := range n {
		c := &conn{id: id, fd: -1, i: -1, buf: make([]byte, 0, 4096)}
		if err := l.dial(c); err != nil {
			l.close()
			return nil, fmt.Errorf("dial %s: %w", addr, err)
		}
		l.conns = append(l.conns, c)
		l.idle = append(l.idle, c)
	}
	return l, nil
}

// dial connects c (a blocking connect: on the loopback it takes
// microseconds) and adds it to the loop's epoll set.
func (l *loop) dial(c *conn) error {
	family, sa := syscall.AF_INET, syscall.Sockaddr(nil)
	if ip4 := l.addr.IP.To4(); ip4 != nil {
		sa4 := &syscall.SockaddrInet4{Port: l.addr.Port}
		copy(sa4.Addr[:], ip4)
		sa = sa4
	} else {
		family = syscall.AF_INET6
		sa6 := &syscall.SockaddrInet6{Port: l.addr.Port}
		copy(sa6.Addr[:], l.addr.IP.To16())
		sa = sa6
	}
	fd, err := syscall.Socket(family, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	for {
		err = syscall.Connect(fd, sa)
		if err != syscall.EINTR {
			break
		}
	}
	if err == nil {
		err = syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
	}
	if err == nil {
		err = syscall.SetNonblock(fd, true)
	}
	if err == nil {
		ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP, Fd: int32(c.id)}
		err = syscall.EpollCtl(l.epfd, syscall.EPOLL_CTL_ADD, fd, &ev)
	}
	if err != nil {
		syscall.Close(fd)
		return err
	}
	c.fd, c.buf, c.out, c.toClose, c.outArmed = fd, c.buf[:0], nil, false, false
	return nil
}

// hangUp closes c's socket (closing takes it out of the epoll set); the
// next request it takes dials again.
func (l *loop) hangUp(c *conn) {
	if c.fd >= 0 {
		syscall.Close(c.fd)
		c.fd = -1
	}
}

func (l *loop) close() {
	for _, c := range l.conns {
		l.hangUp(c)
	}
	syscall.Close(l.epfd)
}

// serve runs the loop until every request is taken and answered (or
// given up on).
func (l *loop) serve(ctx context.Context, s *schedule) {
	defer l.close()
	events := make([]syscall.EpollEvent, len(l.conns))
	nextScan := time.Now()
	for {
		now := time.Now()
		if now.After(s.stop) || ctx.Err() != nil {
			from, to := s.abandon()
			l.t.unsent += int(to - from)
			// Never sent: waited at least until now. Counted in the
			// latencies at that, so that a server that stalled the run's
			// end does not leave the tail looking short.
			for i := from; i < to; i++ {
				if due := l.p.due(s.start, i); due.Before(now) { // a run stopped early: not due yet, not counted
					l.t.latencies = append(l.t.latencies, now.Sub(due))
				}
			}
		}
		for len(l.idle) > 0 {
			i, ok := s.take(now)
			if !ok {
				break
			}
			c := l.idle[len(l.idle)-1]
			l.idle = l.idle[:len(l.idle)-1]
			l.send(c, i, s, now)
		}
		if l.busy == 0 && s.next.Load() >= s.total {
			return
		}
		if !now.Before(nextScan) {
			l.expire(s, now)
			nextScan = now.Add(l.p.timeout / 10)
		}

		// Sleep until the next request is due (if a connection is free to
		// take it), the next look for answers overdue, or an event.
		wake := nextScan
		if len(l.idle) > 0 {
			if i := s.next.Load(); i < s.total {
				wake = minTime(wake, l.p.due(s.start, i))
			}
		}
		n, err := epollWait(l.epfd, events, max(0, time.Until(wake)))
		if err != nil && err != syscall.EINTR {
			panic(fmt.Sprintf("openloop: epoll_pwait2: %v", err)) // a bug of this program, not of the server
		}
		for _, ev := range events[:n] {
			c := l.conns[ev.Fd]
			if ev.Events&syscall.EPOLLOUT != 0 && len(c.out) > 0 {
				l.write(c, s)
			}
			if ev.Events&(syscall.EPOLLIN|syscall.EPOLLRDHUP|syscall.EPOLLHUP|syscall.EPOLLERR) != 0 {
				l.read(c, s)
			}
		}
	}
}

// send writes request i on c, dialing first if c was closed.
func (l *loop) send(c *conn, i int64, s *schedule, now time.Time) {
	c.i, c.due, c.status = i, l.p.due(s.start, i), 0
	l.busy++
	if c.fd < 0 {
		if err := l.dial(c); err != nil {
			l.fail(c, s, "dial")
			return
		}
	}
	if i >= s.first {
		l.t.sent++
		lag := now.Sub(c.due)
		l.t.lags = append(l.t.lags, lag)
		if lag > l.p.late {
			l.t.late++
		}
		if l.unblocked.After(c.due) { // every connection was busy when it fell due
			l.t.queued++
		}
	}
	c.sent = now
	c.out = l.p.requests[i%int64(len(l.p.requests))]
	l.write(c, s)
}

// write writes what is left of c's request; what the socket does not take
// now waits for EPOLLOUT.
func (l *loop) write(c *conn, s *schedule) {
	for len(c.out) > 0 {
		n, err := syscall.Write(c.fd, c.out)
		if err == syscall.EINTR {
			continue
		}
		if err == syscall.EAGAIN {
			if c.outArmed {
				return
			}
			ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP | syscall.EPOLLOUT, Fd: int32(c.id)}
			if err := syscall.EpollCtl(l.epfd, syscall.EPOLL_CTL_MOD, c.fd, &ev); err != nil {
				l.fail(c, s, "io")
				return
			}
			c.outArmed = true
			return
		}
		if err != nil {
			l.fail(c, s, errKind(err))
			return
		}
		c.out = c.out[n:]
		// Only a socket that once refused part of a request has EPOLLOUT
		// to take back: almost every request goes out in one write, and a
		// system call a request to disarm what was never armed cost the
		// generator CPU that the server, on the same cores, did not get.
		if len(c.out) == 0 && c.outArmed {
			ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP, Fd: int32(c.id)}
			_ = syscall.EpollCtl(l.epfd, syscall.EPOLL_CTL_MOD, c.fd, &ev)
			c.outArmed = false
		}
	}
}

// read reads what c's socket holds and finishes the answer if it is whole.
func (l *loop) read(c *conn, s *schedule) {
	if c.fd < 0 {
		return // closed by a failed write a moment ago
	}
	if c.i < 0 { // an idle connection has nothing to say but its end
		l.hangUp(c)
		return
	}
	for {
		if len(c.buf) == cap(c.buf) {
			c.buf = slices.Grow(c.buf, cap(c.buf))
		}
		n, err := syscall.Read(c.fd, c.buf[len(c.buf):cap(c.buf)])
		if err == syscall.EINTR {
			continue
		}
		if err == syscall.EAGAIN {
			return
		}
		if err != nil || n == 0 { // the server closed, or reset
			switch {
			case c.toClose && err == nil: // the body ran to the end: whole
				l.done(c, s, c.status, false)
			case err != nil:
				l.fail(c, s, errKind(err))
			default:
				l.fail(c, s, "closed")
			}
			return
		}
		c.buf = c.buf[:len(c.buf)+n]
		if c.toClose {
			c.buf = c.buf[:0] // the body, to the end
			continue
		}
		r, err := parseResponse(c.buf, l.p.head)
		if err != nil {
			l.fail(c, s, "malformed")
			return
		}
		if r.toClose {
			c.toClose, c.status, c.buf = true, r.status, c.buf[:0]
			continue
		}
		if r.size > 0 {
			c.buf = c.buf[:copy(c.buf, c.buf[r.size:])]
			l.done(c, s, r.status, r.keep)
			return
		}
	}
}

// done counts c's answer and frees c.
func (l *loop) done(c *conn, s *schedule, status int, keep bool) {
	now := time.Now()
	if c.i >= s.first {
		l.t.latencies = append(l.t.latencies, now.Sub(c.due))
		l.t.statuses[status]++
		if now.After(l.t.lastAnswer) {
			l.t.lastAnswer = now
		}
	}
	if !keep || len(c.buf) > 0 { // bytes past the answer: the stream is lost
		l.hangUp(c)
	}
	l.free(c)
}

// fail counts c's request as an error of kind, closes c and frees it. A
// request that timed out is counted in the latencies too, at the time it
// was given up (a lower bound of what it would have waited): left out, the
// slowest requests would vanish from the tail exactly when the server
// stalls. Other errors (a connection reset) have no latency to speak of.
func (l *loop) fail(c *conn, s *schedule, kind string) {
	if c.i >= s.first {
		l.t.errors[kind]++
		if kind == "timeout" {
			l.t.latencies = append(l.t.latencies, time.Since(c.due))
		}
	}
	l.hangUp(c)
	l.free(c)
}

func (l *loop) free(c *conn) {
	if len(l.idle) == 0 {
		l.unblocked = time.Now()
	}
	if c.outArmed && c.fd >= 0 {
		// An answer came before the whole request was written (the server
		// answered early): EPOLLOUT, level-triggered, would wake the loop
		// on every pass until c is used again.
		ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP, Fd: int32(c.id)}
		_ = syscall.EpollCtl(l.epfd, syscall.EPOLL_CTL_MOD, c.fd, &ev)
	}
	c.i, c.out, c.toClose, c.outArmed = -1, nil, false, false
	l.busy--
	l.idle = append(l.idle, c)
}

// expire fails the requests that waited longer than the timeout.
func (l *loop) expire(s *schedule, now time.Time) {
	for _, c := range l.conns {
		if c.i >= 0 && now.Sub(c.sent) > l.p.timeout {
			l.fail(c, s, "timeout")
		}
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// errKind names a failed request's error for the report.
func errKind(err error) string {
	switch {
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return "reset"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	default:
		return "io"
	}
}

// epollWait is epoll_pwait2(2): epoll_wait with a timeout to the
// nanosecond (epoll_wait's is in milliseconds). d < 0 waits for an event
// however long.
func epollWait(epfd int, events []syscall.EpollEvent, d time.Duration) (int, error) {
	const sysEpollPwait2 = 441 // the same number on every architecture
	var ts *syscall.Timespec
	if d >= 0 {
		t := syscall.NsecToTimespec(int64(d))
		ts = &t
	}
	n, _, errno := syscall.Syscall6(sysEpollPwait2, uintptr(epfd), uintptr(unsafe.Pointer(&events[0])),
		uintptr(len(events)), uintptr(unsafe.Pointer(ts)), 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}
