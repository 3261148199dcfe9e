package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"
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

// An outcome is what the requests past the warm-up met.
type outcome struct {
	start      time.Time       // the schedule's zero: request 0 was due then
	window     time.Time       // when the first measured request was due
	lastAnswer time.Time       // when the last measured answer was read
	latencies  []time.Duration // of every measured answer, from when it was due; sorted
	lags       []time.Duration // of every measured request written, from due to the write; sorted
	statuses   map[int]int
	errors     map[string]int // by kind: no answer, so no latency
	sent       int            // measured requests written to a connection
	late       int            // of those, written more than plan.late after they were due
	unsent     int            // measured requests never written: the run was stopped first
}

// tally is one connection's share of the outcome, merged at the end so
// that the connections share nothing but the next request's index.
type tally struct {
	latencies  []time.Duration
	lags       []time.Duration
	statuses   map[int]int
	errors     map[string]int
	sent, late int
	unsent     int
	lastAnswer time.Time
}

// run sends the plan's requests on their schedule and gathers what they
// met. Request i is due at start + i/rate. A pacer hands each request to
// the connections as it falls due; a connection free takes the next one,
// writes it and reads the answer. A request due while every connection
// still waits for an answer is taken by the first to be free, late, and
// is timed from when it was due all the same (wrk2's rule: a closed loop
// that times from the write leaves out exactly the waits a stalled server
// causes, "coordinated omission"). Nothing is sent after warm-up +
// duration + timeout, nor once ctx is done: what is left is unsent.
func (p *plan) run(ctx context.Context) (*outcome, error) {
	if p.rate <= 0 || p.conns <= 0 || len(p.requests) == 0 {
		return nil, errors.New("openloop: a plan needs a rate, connections and a request")
	}
	total, first := p.count(), p.firstMeasured()
	conns := make([]net.Conn, p.conns)
	for k := range conns {
		c, err := net.DialTimeout("tcp", p.addr, p.timeout)
		if err != nil {
			for _, c := range conns[:k] {
				c.Close()
			}
			return nil, fmt.Errorf("dial %s: %w", p.addr, err)
		}
		conns[k] = c
	}

	start := time.Now()
	stop := start.Add(p.warmup + p.duration + p.timeout)
	// The queue holds requests due and not yet taken: a backlog while
	// the server stalls. Past its size the pacer waits with them; they
	// are late either way, and timed from when they were due.
	ready := make(chan int64, min(total, 1<<16))
	tallies := make([]tally, p.conns)
	var wg sync.WaitGroup
	for k := range conns {
		t := &tallies[k]
		t.latencies = make([]time.Duration, 0, (total-first)/int64(p.conns)+16)
		t.lags = make([]time.Duration, 0, cap(t.latencies))
		t.statuses, t.errors = map[int]int{}, map[string]int{}
		wg.Go(func() { p.work(ctx, conns[k], start, stop, ready, first, t) })
	}
	released := p.pace(ctx, start, total, ready)
	wg.Wait()

	o := &outcome{start: start, window: p.due(start, first), statuses: map[int]int{}, errors: map[string]int{}}
	o.unsent = int(total - max(released, first)) // never handed out: the run was stopped
	for _, t := range tallies {
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
		o.unsent += t.unsent
		if t.lastAnswer.After(o.lastAnswer) {
			o.lastAnswer = t.lastAnswer
		}
	}
	slices.Sort(o.latencies)
	slices.Sort(o.lags)
	return o, nil
}

// pace puts request indices on ready as they fall due, then closes it;
// it returns how many it put there (total, unless ctx ended the run).
//
// It sleeps with nanosleep(2), not time.Sleep: an idle Go program's
// timers wake through epoll_wait, whose timeout is whole milliseconds
// (a 100 µs sleep takes one ms), and every request of a quiet run would
// go out up to a millisecond late, that much added to its latency. Only
// waits longer than a few milliseconds use time.Sleep, for most of their
// length.
func (p *plan) pace(ctx context.Context, start time.Time, total int64, ready chan<- int64) int64 {
	defer close(ready)
	var i int64
	for i < total && ctx.Err() == nil {
		now := time.Now()
		for ; i < total && !p.due(start, i).After(now); i++ {
			ready <- i
		}
		if i == total {
			break
		}
		wait := time.Until(p.due(start, i))
		if wait > 3*time.Millisecond {
			time.Sleep(wait - 2*time.Millisecond)
			continue
		}
		if wait > 0 {
			// EINTR (the runtime's preemption signal) only ends the sleep
			// early; the loop looks at the clock again.
			ts := syscall.NsecToTimespec(int64(wait))
			_ = syscall.Nanosleep(&ts, nil)
		}
	}
	return i
}

// work is one connection's loop; see run.
func (p *plan) work(ctx context.Context, c net.Conn, start, stop time.Time, ready <-chan int64, first int64, t *tally) {
	r := bufio.NewReaderSize(c, 16<<10)
	// The deadline is moved only when less than half the timeout is left:
	// every request gets between timeout/2 and timeout, and the runtime's
	// timer is touched a few times a run instead of twice a request.
	var deadline time.Time
	defer func() {
		if c != nil {
			c.Close()
		}
	}()
	for i := range ready {
		measured := i >= first
		due := p.due(start, i)
		now := time.Now()
		if now.After(stop) || ctx.Err() != nil {
			if measured {
				t.unsent++
			}
			continue
		}
		if c == nil {
			var err error
			if c, err = net.DialTimeout("tcp", p.addr, p.timeout); err != nil {
				c = nil
				if measured {
					t.errors["dial"]++
				}
				continue
			}
			r.Reset(c)
			deadline = time.Time{}
		}
		if measured {
			t.sent++
			t.lags = append(t.lags, now.Sub(due))
			if now.Sub(due) > p.late {
				t.late++
			}
		}
		if deadline.Sub(now) < p.timeout/2 {
			deadline = now.Add(p.timeout)
			c.SetDeadline(deadline)
		}
		status, keep, err := p.exchange(c, r, p.requests[i%int64(len(p.requests))])
		end := time.Now()
		if err != nil || !keep {
			c.Close()
			c = nil
		}
		if !measured {
			continue
		}
		if err != nil {
			t.errors[errorKind(err)]++
			continue
		}
		t.latencies = append(t.latencies, end.Sub(due))
		t.statuses[status]++
		if end.After(t.lastAnswer) {
			t.lastAnswer = end
		}
	}
}

// exchange writes one request and reads its answer.
func (p *plan) exchange(c net.Conn, r *bufio.Reader, req []byte) (status int, keep bool, err error) {
	if _, err := c.Write(req); err != nil {
		return 0, false, err
	}
	return readResponse(r, p.head)
}

// errorKind names a failed request's error for the report.
func errorKind(err error) string {
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout(), errors.Is(err, os.ErrDeadlineExceeded):
		return "timeout"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "closed" // the server closed the connection before answering whole
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return "reset"
	case errors.Is(err, errMalformed):
		return "malformed"
	default:
		return "io"
	}
}
