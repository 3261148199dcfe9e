package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// After the crowd, the rehearsal asks the server what the sale did, and
// waits for it to settle first: in async mode a 200's order reaches MySQL
// moments later (GET /orders/{id} says pending until then, and failed if
// MySQL refused it for good), and the live figures count the queue. Each
// question is asked until it has a final answer or -drain runs out; a
// question the server kept answering 429, 5xx or nothing at all is left
// unknown, which the checks report apart from a broken promise.
//
// One question the crowd's own answers cannot settle is whether a user
// could get a second order: a user stops at their first 200. So each
// winner presses once more after the sale (a probe), and the contract
// says the answer is already_ordered (or sold_out): a 200 is a second
// order of one user.

// A Probe is a winner's press after the sale.
type Probe struct {
	User   int    `json:"user"`   // index in Run.Users
	Status int    `json:"status"` // 0: no answer, after every retry
	Code   string `json:"code"`
	Order  string `json:"order,omitempty"` // a 200's order_id: a second order
}

// finalStates are the order statuses that will not change by themselves
// (docs/api.md, GET /orders/{id}): pending will, and a status the
// contract does not know is "not final".
var finalStates = map[string]bool{"unpaid": true, "paid": true, "cancelled": true, "refunded": true, "failed": true, "created": true}

// after asks the server what the sale did: every 200's order once it is
// final, each winner's probe, the live figures once the async queue is
// empty, and the stock left.
func after(ctx context.Context, cl *http.Client, base string, r *Run, accounts []account, d *driver, settle, drain time.Duration) After {
	var out After
	// The live figures count answers in each instance's memory and add
	// them to Redis once a second: wait for the last second to land.
	sleepUntil(ctx, time.Now().Add(settle))
	until := time.Now().Add(drain)
	baseOf := func(u int) string { return r.Bases[r.Users[u].Base] }

	type job struct {
		user int
		id   string
	}
	var jobs []job
	asked := map[string]bool{}
	for _, a := range r.Attempts {
		if a.sold() && !asked[a.Order] {
			asked[a.Order] = true
			jobs = append(jobs, job{a.User, a.Order})
		}
	}
	out.Orders = make([]OrderSeen, len(jobs))
	fanOut(len(jobs), func(i int) {
		j := jobs[i]
		o := finalOrder(ctx, cl, baseOf(j.user), accounts[j.user].Token, j.id, until)
		o.User = j.user
		out.Orders[i] = o
	})

	// The probes: each winner whose order stands presses once more.
	var winners []int
	probed := map[int]bool{}
	for _, o := range out.Orders {
		if o.Status == http.StatusOK && o.State != "failed" && !probed[o.User] {
			probed[o.User] = true
			winners = append(winners, o.User)
		}
	}
	out.Probes = make([]Probe, len(winners))
	fanOut(len(winners), func(i int) {
		u := winners[i]
		out.Probes[i] = probe(ctx, cl, baseOf(u), accounts[u].Token, r.Voucher.ID, until)
		out.Probes[i].User = u
	})

	f, opens, err := watchLive(ctx, cl, base, r.Voucher.ID, until)
	out.Live, out.LiveOpens = f, opens
	if err != nil {
		out.LiveErr = err.Error()
	}
	var v voucherJSON
	err = persist(ctx, until, func() error {
		var err error
		v, err = getVoucher(ctx, cl, base, r.Voucher.ID)
		return err
	})
	if err != nil {
		out.StockErr = err.Error()
	} else {
		out.Stock = v.Stock
	}
	out.Read = d.since()
	return out
}

// fanOut calls f(0), ..., f(n-1), 16 at once: the server's cap on one
// address's requests in flight is far above that.
func fanOut(n int, f func(i int)) {
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(n, 16) {
		wg.Go(func() {
			for i := range next {
				f(i)
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}

// transient reports whether an error may pass if the request is sent
// again: no answer, 429 or a 5xx.
func transient(err error) bool {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.status == http.StatusTooManyRequests || ae.status >= 500
	}
	return err != nil && !errors.Is(err, context.Canceled)
}

// persist calls try until it returns nil or an error that is not
// transient, or until passes: waiting as Retry-After says, else 250 ms
// doubling to 2 s. It returns try's last error.
func persist(ctx context.Context, until time.Time, try func() error) error {
	wait := 250 * time.Millisecond
	for {
		err := try()
		if !transient(err) {
			return err
		}
		next := wait
		var ae *apiError
		if errors.As(err, &ae) && ae.retryAfter > 0 {
			next = ae.retryAfter
		}
		wait = min(2*wait, 2*time.Second)
		if time.Now().Add(next).After(until) || !sleepUntil(ctx, time.Now().Add(next)) {
			return err
		}
	}
}

// finalOrder asks for an order, with its buyer's token, until its status
// is final or until passes. What it could not learn stays in the answer:
// Status 0 (no answer) or 429/5xx, or a status still pending.
func finalOrder(ctx context.Context, cl *http.Client, base, token, id string, until time.Time) OrderSeen {
	for poll := 250 * time.Millisecond; ; poll = min(2*poll, time.Second) {
		var o OrderSeen
		persist(ctx, until, func() error {
			var err error
			o, err = getOrder(ctx, cl, base, token, id)
			return err
		})
		if o.Status != http.StatusOK || finalStates[o.State] || time.Now().Add(poll).After(until) || !sleepUntil(ctx, time.Now().Add(poll)) {
			return o
		}
	}
}

// probe presses the buy button once more for a winner, retried while the
// answers are transient (a 429 of the per-user lock, say).
func probe(ctx context.Context, cl *http.Client, base, token, voucher string, until time.Time) Probe {
	var p Probe
	var out struct {
		OrderID string `json:"order_id"`
	}
	err := persist(ctx, until, func() error {
		return call(ctx, cl, http.MethodPost, base+"/seckill/"+voucher, token, nil, http.StatusOK, &out)
	})
	var ae *apiError
	switch {
	case err == nil:
		p.Status, p.Code, p.Order = http.StatusOK, codeOK, out.OrderID
	case errors.As(err, &ae):
		p.Status, p.Code = ae.status, ae.code
	default:
		p.Code = transportCode(err)
	}
	return p
}

// watchLive reads the voucher's live figures until the async queue is
// empty (at once in sync mode, where it is null), or until passes, and
// returns the last figures read. It keeps one stream open and reads its
// events (one a second) rather than opening one per reading: an address
// may open 8 streams at once, then 1 a second, and is answered 429 past
// that. On a 429 it waits as Retry-After says; a stream that ends is
// opened again, a second later at the soonest. opens counts the streams
// it opened.
func watchLive(ctx context.Context, cl *http.Client, base, id string, until time.Time) (last *Figures, opens int, err error) {
	for {
		opens++
		opened := time.Now()
		var f *Figures
		f, err = readLive(ctx, cl, base, id, until)
		if f != nil {
			last = f
		}
		if last != nil && (last.Queue == nil || *last.Queue == 0) {
			return last, opens, nil
		}
		wait := time.Until(opened.Add(time.Second))
		var ae *apiError
		if errors.As(err, &ae) && ae.retryAfter > 0 {
			wait = ae.retryAfter
		}
		if err != nil && !transient(err) && !errors.Is(err, errStreamEnded) {
			return last, opens, err
		}
		if time.Now().Add(wait).After(until) || !sleepUntil(ctx, time.Now().Add(wait)) {
			if last != nil && err == nil {
				err = fmt.Errorf("the async queue still held %d orders after -drain", *last.Queue)
			}
			return last, opens, err
		}
	}
}

// errStreamEnded is a live stream that closed before the figures wanted.
var errStreamEnded = errors.New("the live stream ended")

// readLive opens the voucher's live stream and reads its figures events
// until one says the async queue is empty, the stream ends, or until
// passes (the first event is waited for however near until is: the
// stream sends one a second). It returns the last figures read.
func readLive(ctx context.Context, cl *http.Client, base, id string, until time.Time) (*Figures, error) {
	ctx, cancel := context.WithDeadline(ctx, later(until, time.Now().Add(2*time.Second)))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/live/"+id+"/events", nil)
	if err != nil {
		return nil, err
	}
	resp, err := cl.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, &apiError{status: resp.StatusCode, body: fmt.Sprintf("GET /live/%s/events", id), retryAfter: retryAfter(resp.Header)}
	}
	rd := bufio.NewReader(resp.Body)
	var last *Figures
	for {
		ev, err := nextEvent(rd, "figures")
		if err != nil {
			if last != nil && ctx.Err() != nil {
				return last, nil // until passed: the caller says what was left
			}
			if ctx.Err() == nil {
				err = errStreamEnded
			}
			return last, fmt.Errorf("GET /live/%s/events: %w", id, err)
		}
		var f Figures
		if err := json.Unmarshal(ev, &f); err != nil {
			return last, fmt.Errorf("GET /live/%s/events: %w", id, err)
		}
		last = &f
		if f.Queue == nil || *f.Queue == 0 {
			return last, nil
		}
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
