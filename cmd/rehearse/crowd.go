package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// The crowd. A sale is not a constant rate: people turn up before it
// opens and some press too early, everybody presses in the first second
// spread by how fast they react, clients retry, bots poll, and the crowd
// thins out once the stock is gone. Each part is a field of Shape, and
// each field a flag.
//
// Each user's first press is planned before the run (open arrivals): a
// slow server cannot slow the crowd down, as it would a pool of workers
// that each wait for their answer before sending the next request. After
// that a person is closed: a retry comes after the answer before it, plus
// the wait, as a person's does. A bot is not: it polls on a fixed beat
// planned from its first poll, however slow the answers (see bot). Every
// request is timed from when it should have left (Due), and how late the
// generator sent it is its own lateness.

// Shape is the traffic a rehearsal makes.
type Shape struct {
	Users int   `json:"users"` // people, one account each
	Bots  int   `json:"bots"`  // bots, one account each
	Stock int64 `json:"stock"`
	// People turn up over Lead before the start; Early of them press as
	// they arrive (and are told not_started), the rest wait. Late of them
	// turn up after the start instead, Tail apart on average (an
	// exponential decay: the tail after sold-out).
	Lead  time.Duration `json:"lead"`
	Early float64       `json:"early"`
	Late  float64       `json:"late"`
	Tail  time.Duration `json:"tail"`
	// React is the median time a person takes to press once the sale
	// opens or they arrive (log-normal, half of them within React, one in
	// twenty past 2.3 × React).
	React time.Duration `json:"react"`
	// Honour of people wait as Retry-After says; the others, and every
	// person on an answer without one, back off exponentially from
	// Backoff up to BackoffMax with full jitter (a random wait up to
	// the bound). After Retries retries a person gives up.
	Honour float64 `json:"honour"`
	// Again of people press once more as soon as they are told 200, as
	// people unsure it worked do. The contract answers already_ordered:
	// a second 200 is a second order of one user, which the checks catch.
	Again      float64       `json:"again"`
	Retries    int           `json:"retries"`
	Backoff    time.Duration `json:"backoff"`
	BackoffMax time.Duration `json:"backoff_max"`
	// Bots start polling BotLead before the start, every BotEvery, with
	// BotConns requests in flight, ignoring Retry-After, until they win or
	// the stock is gone.
	BotEvery time.Duration `json:"bot_every"`
	BotLead  time.Duration `json:"bot_lead"`
	BotConns int           `json:"bot_conns"`
	// The run stops sending Duration after the start; a request gets no
	// answer after Timeout.
	Duration time.Duration `json:"duration"`
	Timeout  time.Duration `json:"timeout"`
	// Conns is "user": a connection (or BotConns) of its own per user, so
	// that the storm of connections at the start is part of the test; or
	// "shared": one pool for the crowd, as a load tool has it.
	Conns string `json:"conns"`
	Seed  uint64 `json:"seed"`
	// Room, with a waiting room: admitted a second, and how long a hold lasts.
	RoomRate int           `json:"room_rate,omitempty"`
	RoomHold time.Duration `json:"room_hold,omitempty"`
}

// A plan is one user's part, fixed before the run.
type plan struct {
	user  User
	early bool          // presses on arrival, before the start
	first time.Duration // due time of the first press at or after the start
}

// planCrowd lays out who arrives when and presses when. The same shape
// and seed give the same plan.
func planCrowd(s Shape) []plan {
	rng := rand.New(rand.NewPCG(s.Seed, 0x5eccc111))
	react := func() time.Duration {
		// Log-normal with median React, σ = 0.5: most people within a
		// few hundred milliseconds, a few slow.
		return time.Duration(float64(s.React) * math.Exp(0.5*rng.NormFloat64()))
	}
	// Who presses again is drawn apart, so that a seed plans the same
	// arrivals and presses whatever -again says.
	again := rand.New(rand.NewPCG(s.Seed, 0xa6a1))
	var out []plan
	for range s.Users {
		p := plan{user: User{Kind: person, Honours: rng.Float64() < s.Honour, Again: again.Float64() < s.Again}}
		if rng.Float64() < s.Late {
			p.user.Arrive = time.Duration(rng.ExpFloat64() * float64(s.Tail))
			p.first = p.user.Arrive + react()
		} else {
			p.user.Arrive = -time.Duration(rng.Float64() * float64(s.Lead))
			p.early = rng.Float64() < s.Early
			p.first = react()
		}
		out = append(out, p)
	}
	for range s.Bots {
		// Bots start together, spread over one poll so that they do not
		// all land in one instant.
		at := -s.BotLead + time.Duration(rng.Float64()*float64(s.BotEvery))
		out = append(out, plan{user: User{Kind: bot, Arrive: at}, first: at})
	}
	return out
}

// A driver runs a planned crowd against the voucher and logs every
// attempt.
type driver struct {
	shape    Shape
	bases    []string
	voucher  string
	accounts []account
	t0       time.Time // the sale's start, with this process' monotonic clock
	shared   *http.Client

	mu       sync.Mutex
	attempts []Attempt
	rng      sync.Mutex // guards jitter
	jitter   *rand.Rand
}

// since is the run's clock: time since the start.
func (d *driver) since() time.Duration { return time.Since(d.t0) }

// drive runs the crowd to its end and returns the attempts, in the order
// they were answered.
func (d *driver) drive(ctx context.Context, plans []plan, users []User) []Attempt {
	d.jitter = newJitter(d.shape.Seed)
	if d.shape.Conns == "shared" {
		d.shared = &http.Client{Timeout: d.shape.Timeout, Transport: transport(1024)}
	}
	// Every request is due by Duration; its answer, Timeout after that.
	ctx, cancel := context.WithDeadline(ctx, d.t0.Add(d.shape.Duration+d.shape.Timeout+time.Second))
	defer cancel()
	var wg sync.WaitGroup
	for u, p := range plans {
		cl := d.shared
		if cl == nil {
			conns := 1
			if users[u].Kind == bot {
				conns = max(d.shape.BotConns, 1)
			}
			cl = &http.Client{Timeout: d.shape.Timeout, Transport: transport(conns)}
			defer cl.CloseIdleConnections()
		}
		if users[u].Kind == bot {
			var won atomic.Bool
			for c := range max(d.shape.BotConns, 1) {
				wg.Go(func() {
					d.bot(ctx, cl, u, p.first+time.Duration(c)*d.shape.BotEvery/time.Duration(max(d.shape.BotConns, 1)), &won)
				})
			}
			continue
		}
		wg.Go(func() { d.person(ctx, cl, u, p) })
	}
	wg.Wait()
	if d.shared != nil {
		d.shared.CloseIdleConnections()
	}
	return d.attempts
}

// transport is a connection pool of conns connections to each server.
func transport(conns int) *http.Transport {
	return &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: conns,
		MaxIdleConns:        max(conns, 100),
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
}

// Answers after which a user stops: the sale is over for them.
var final = map[string]bool{
	codeOK: true, "sold_out": true, "already_ordered": true, "ended": true,
	"not_found": true, "unauthorized": true, "forbidden": true, "invalid_argument": true,
}

// person presses as planned: early if they do, then at the start plus
// their reaction, then again after each answer that invites it.
func (d *driver) person(ctx context.Context, cl *http.Client, u int, p plan) {
	due := p.first
	if p.early {
		due = p.user.Arrive
	}
	retries, again := 0, p.user.Again
	for try := 0; due <= d.shape.Duration; try++ {
		a, ok := d.press(ctx, cl, u, try, due, 0)
		if ok && a.sold() && again {
			again, due = false, a.Done // presses again at once
			continue
		}
		if !ok || final[a.Code] || (a.Status >= 400 && a.Status < 500 && a.Status != 409 && a.Status != 429) {
			return
		}
		switch {
		case a.Code == "not_started" && due < p.first:
			// An early press: they watch the countdown, and press when
			// it ends, at their planned moment, even if this answer came
			// back after it (timed from then, a slow answer before the
			// start shows in that press's latency rather than moving it).
			due = p.first
		case retries == d.shape.Retries:
			return // gives up
		default:
			retries++
			wait := d.backoff(retries)
			if p.user.Honours && a.RetryAfter > 0 {
				wait = a.RetryAfter
			}
			due = a.Done + wait
		}
	}
}

// bot polls every BotEvery from its first due time, ignoring Retry-After,
// until it or a sibling connection of the same bot is done.
//
// The beat is fixed: poll n is due at first + n × BotEvery, whenever the
// answers come. A connection carries one request at a time, so a poll
// due while the one before it is still out leaves when that answer comes,
// and is timed from when it was due: a server that stalls for a second
// shows a second of latency on every poll it held up, rather than a bot
// that quietly polled less (coordinated omission). The wait is the
// poll's Held, which is the server's doing, not the generator's
// lateness.
func (d *driver) bot(ctx context.Context, cl *http.Client, u int, due time.Duration, done *atomic.Bool) {
	free := due // when the connection's last answer came
	for try := 0; due <= d.shape.Duration && !done.Load(); try++ {
		a, ok := d.press(ctx, cl, u, try, due, max(free-due, 0))
		if !ok || final[a.Code] {
			done.Store(true)
			return
		}
		free, due = a.Done, due+d.shape.BotEvery
	}
}

// backoff is the wait before retry n without a Retry-After: exponential
// from Backoff, capped at BackoffMax, with full jitter (AWS Architecture
// Blog, "Exponential Backoff And Jitter"): a random wait up to the bound,
// so that the users refused together do not come back together.
func (d *driver) backoff(n int) time.Duration {
	bound := min(d.shape.BackoffMax, d.shape.Backoff<<min(n-1, 30))
	d.rng.Lock()
	defer d.rng.Unlock()
	return time.Duration(d.jitter.Int64N(int64(bound) + 1))
}

// newJitter is the random source of the crowd's waits: seeded, so that a
// seed makes the same crowd, and guarded by driver.rng.
func newJitter(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x8ac0ff)) }

// normal draws from the standard normal distribution.
func (d *driver) normal() float64 {
	d.rng.Lock()
	defer d.rng.Unlock()
	return d.jitter.NormFloat64()
}

// press sends one press at due (waiting until then), or at once when
// due has passed, and logs it. held is how long past due it could not
// leave for the answer before it on its connection (a bot's). ok is
// false when the run ended before it could be sent.
func (d *driver) press(ctx context.Context, cl *http.Client, u, try int, due, held time.Duration) (Attempt, bool) {
	if !sleepUntil(ctx, d.t0.Add(due)) {
		return Attempt{}, false
	}
	a := Attempt{User: u, Try: try, Due: due, Held: held}
	base := d.bases[u%len(d.bases)]
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/seckill/"+d.voucher, nil)
	if err != nil {
		panic(err) // the URL was checked when the run began
	}
	req.Header.Set("Authorization", "Bearer "+d.accounts[u].Token)
	a.Sent = d.since()
	resp, err := cl.Do(req)
	var body []byte
	if err == nil {
		body, err = io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		resp.Body.Close()
	}
	a.Done = d.since()
	switch {
	case err != nil:
		a.Code, a.Err = transportCode(err), cause(err)
	case resp.StatusCode == http.StatusOK:
		a.Status, a.Code = resp.StatusCode, codeOK
		a.Order = orderID(body)
	default:
		a.Status, a.Code, a.RetryAfter = resp.StatusCode, errorCode(body), retryAfter(resp.Header)
		if a.Code == "" {
			a.Code = "http_" + strconv.Itoa(resp.StatusCode)
		}
	}
	d.log(a)
	return a, true
}

// orderID reads a 200's order_id.
func orderID(body []byte) string {
	var ok struct {
		OrderID string `json:"order_id"`
	}
	json.Unmarshal(body, &ok) // a 200 without one is caught by the checks
	return ok.OrderID
}

// transportCode names a request that got no answer.
func transportCode(err error) string {
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return codeTimeout
	}
	return codeConnError
}

// cause is err without the method and URL that every one of the crowd's
// errors starts with.
func cause(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err.Error()
	}
	return err.Error()
}

// sleepUntil waits until t, or returns false if ctx ends first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	wait := time.Until(t)
	if wait <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// machine describes this generator.
func machine(users int, cpu, wall time.Duration) Machine {
	host, _ := os.Hostname()
	return Machine{Host: host, Cores: runtime.NumCPU(), CPU: cpu, Wall: wall, Users: users}
}
