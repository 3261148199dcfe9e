package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"seckill/internal/chart"
)

// With a waiting room (docs/api.md, "Waiting room"), a person does not
// press at the start: they join the room when they arrive, wait on its
// events stream, and press when it admits them (after their reaction
// time). Bots join too, then poll the buy button as before: the room
// should answer them not_admitted until their number comes up.
//
// TestAgainstTheDemo runs it on the embedded demo; docs/rehearse.md has
// its figures on three instances.

// RoomLine is what the crowd saw of the line, user by user.
type RoomLine struct {
	Users []RoomUser `json:"users"`
}

// A RoomUser is one user's time in the line, on the run's clock.
type RoomUser struct {
	User     int           `json:"user"`
	Joined   time.Duration `json:"joined"`
	In       bool          `json:"in_line"` // the join was answered 200 (else Final is the refusal's code)
	Number   string        `json:"number,omitempty"`
	Admitted time.Duration `json:"admitted"` // when the stream said so; -1: never
	// HoldUntil is when the hold admission gave them ends (admitted_until),
	// unless they buy first.
	HoldUntil time.Duration `json:"hold_until,omitempty"`
	// ETA is the first estimate of the wait they were shown, in seconds,
	// and ETAAt when (nil: none was shown).
	ETA   *int          `json:"eta_seconds,omitempty"`
	ETAAt time.Duration `json:"eta_at"`
	Final string        `json:"final_state"` // the last state the stream gave
	// Left is when the stream said they would not be admitted (sold_out,
	// expired, ordered), or ended; nil while they were still in line.
	Left *time.Duration `json:"left,omitempty"`
}

// roomState is a voucher's room as GET /vouchers/{id} answers it.
type roomState struct {
	State   string `json:"state"`
	Serving string `json:"serving"`
	Waiting int    `json:"waiting"`
}

// place is GET /vouchers/{id}/room, and each event of its stream.
type place struct {
	State         string     `json:"state"`
	Number        *string    `json:"number"`
	Ahead         *int       `json:"ahead"`
	ETA           *int       `json:"eta_seconds"`
	AdmittedUntil *time.Time `json:"admitted_until"`
}

// driveRoom runs the crowd through the room.
func (d *driver) driveRoom(ctx context.Context, plans []plan, users []User) ([]Attempt, *RoomLine) {
	d.jitter = newJitter(d.shape.Seed)
	ctx, cancel := context.WithDeadline(ctx, d.t0.Add(d.shape.Duration+d.shape.Timeout+time.Second))
	defer cancel()
	line := &RoomLine{Users: make([]RoomUser, len(plans))}
	var wg sync.WaitGroup
	for u, p := range plans {
		cl := &http.Client{Transport: transport(2)} // the stream's connection, and the presses'
		defer cl.CloseIdleConnections()
		line.Users[u] = RoomUser{User: u, Admitted: -1}
		wg.Go(func() {
			ru := &line.Users[u]
			if !d.join(ctx, cl, u, p.user, ru) {
				return
			}
			if users[u].Kind == bot {
				var won atomic.Bool
				d.bot(ctx, &http.Client{Timeout: d.shape.Timeout, Transport: cl.Transport}, u, max(p.first, ru.Joined), &won)
				return
			}
			if d.wait(ctx, cl, u, ru) {
				p.first = ru.Admitted + time.Duration(float64(d.shape.React)*math.Exp(0.5*d.normal()))
				p.early = false
				d.person(ctx, &http.Client{Timeout: d.shape.Timeout, Transport: cl.Transport}, u, p)
			}
		})
	}
	wg.Wait()
	return d.attempts, line
}

// join joins the room when the user arrives, each try logged as an
// attempt of kind "join". A join answered 429, 5xx or nothing is tried
// again, as a press is: after Retry-After for a person who honours it,
// else after an exponential backoff with full jitter, up to Retries
// times. It reports whether the user is in the line.
func (d *driver) join(ctx context.Context, cl *http.Client, u int, user User, ru *RoomUser) bool {
	jcl := &http.Client{Timeout: d.shape.Timeout, Transport: cl.Transport}
	due := user.Arrive
	for try := 0; ; try++ {
		if due > d.shape.Duration || !sleepUntil(ctx, d.t0.Add(due)) {
			return false // nothing is sent after -duration
		}
		a := Attempt{User: u, Try: try, Due: due, Kind: "join", Sent: d.since()}
		var p place
		err := call(ctx, jcl, http.MethodPost, d.bases[u%len(d.bases)]+"/vouchers/"+d.voucher+"/room", d.accounts[u].Token, nil, http.StatusOK, &p)
		a.Done = d.since()
		switch e := err.(type) {
		case nil:
			a.Status, a.Code = 200, codeOK
		case *apiError:
			a.Status, a.Code, a.RetryAfter = e.status, e.code, e.retryAfter
		default:
			a.Code, a.Err = transportCode(err), cause(err)
		}
		d.log(a)
		if err == nil {
			ru.Joined, ru.In = a.Done, true
			if p.Number != nil {
				ru.Number = *p.Number
			}
			return true
		}
		if !transient(err) || try == d.shape.Retries || ctx.Err() != nil {
			ru.Joined, ru.Final, ru.Left = a.Done, a.Code, &a.Done
			return false
		}
		wait := d.backoff(try + 1)
		if user.Honours && a.RetryAfter > 0 {
			wait = a.RetryAfter
		}
		if a.Done+wait > d.shape.Duration {
			ru.Joined, ru.Final, ru.Left = a.Done, a.Code, &a.Done
			return false
		}
		due = a.Done + wait
	}
}

// wait follows the user's place on the room's events stream until they
// are admitted (true) or the room says they will not be (false).
func (d *driver) wait(ctx context.Context, cl *http.Client, u int, ru *RoomUser) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.bases[u%len(d.bases)]+"/vouchers/"+d.voucher+"/room/events", nil)
	if err != nil {
		return false
	}
	req.Header.Set("Authorization", "Bearer "+d.accounts[u].Token)
	resp, err := cl.Do(req)
	if err != nil {
		ru.Final = codeConnError
		return false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		ru.Final = fmt.Sprintf("http_%d", resp.StatusCode)
		return false
	}
	rd := bufio.NewReader(resp.Body)
	for {
		data, err := nextEvent(rd, "place")
		if err != nil {
			left := d.since()
			ru.Left = &left
			return false
		}
		var p place
		if json.Unmarshal(data, &p) != nil {
			continue
		}
		now := d.since()
		ru.Final = p.State
		if p.Number != nil {
			ru.Number = *p.Number
		}
		if p.ETA != nil && ru.ETA == nil {
			ru.ETA, ru.ETAAt = p.ETA, now
		}
		switch p.State {
		case "admitted":
			ru.Admitted, ru.HoldUntil = now, now+d.shape.RoomHold
			if p.AdmittedUntil != nil {
				ru.HoldUntil = p.AdmittedUntil.Sub(d.t0) // the wall clock's, on the run's
			}
			return true
		case "ordered", "sold_out", "expired":
			ru.Left = &now
			return false
		}
	}
}

// log records an attempt.
func (d *driver) log(a Attempt) {
	d.mu.Lock()
	d.attempts = append(d.attempts, a)
	d.mu.Unlock()
}

// RoomFigures are the line's figures, for the report.
type RoomFigures struct {
	Joined      int         `json:"joined"`
	Admitted    int         `json:"admitted"`
	Ordered     int         `json:"ordered"`
	Wait        Percentiles `json:"wait"`         // joining to admission, of those admitted
	EstimateErr Percentiles `json:"estimate_err"` // |the wait they had − the first estimate they were shown|
	// Waiting, AdmittedPer and Held are per bin of the run's timeline: how
	// many had joined and were not yet admitted, how many were admitted,
	// and how many units admitted buyers held (admitted, not yet bought,
	// the hold not ended) at the bin's end: units that were neither sold
	// nor for anyone else.
	Bin         time.Duration `json:"bin"`
	From        time.Duration `json:"from"`
	Waiting     []int         `json:"waiting"`
	AdmittedPer []int         `json:"admitted_per_bin"`
	Held        []int         `json:"held"`
	PeakHeld    int           `json:"peak_held"`
}

func roomFigures(r *Run, tl Timeline) *RoomFigures {
	f := &RoomFigures{Bin: tl.Bin}
	wins := winsByUser(r)
	var waits, errs []time.Duration
	for _, ru := range r.Room.Users {
		if !ru.In {
			continue // refused at the door, or never got there
		}
		f.Joined++
		if len(wins[ru.User]) > 0 {
			f.Ordered++
		}
		if ru.Admitted < 0 {
			continue
		}
		f.Admitted++
		waits = append(waits, ru.Admitted-ru.Joined)
		if ru.ETA != nil {
			shown := time.Duration(*ru.ETA) * time.Second
			errs = append(errs, (ru.Admitted - ru.ETAAt - shown).Abs())
		}
	}
	f.Wait, f.EstimateErr = percentiles(waits), percentiles(errs)
	if len(tl.Bins) == 0 {
		return f
	}
	f.From = tl.Bins[0].At
	n := len(tl.Bins)
	f.Waiting, f.AdmittedPer, f.Held = make([]int, n), make([]int, n), make([]int, n)
	idx := func(d time.Duration) int { return min(max(int((d-f.From)/tl.Bin), 0), n-1) }
	bought := map[int]time.Duration{} // each buyer's first 200
	for _, a := range r.Attempts {
		if b, ok := bought[a.User]; a.sold() && (!ok || a.Done < b) {
			bought[a.User] = a.Done
		}
	}
	for _, ru := range r.Room.Users {
		if !ru.In {
			continue
		}
		if ru.Admitted >= 0 {
			// Held from admission until the order or the hold's end,
			// counted at each bin's end.
			end := max(ru.HoldUntil, ru.Admitted)
			if b, ok := bought[ru.User]; ok && b < end {
				end = b
			}
			for i := idx(ru.Admitted); i < n; i++ {
				at := f.From + time.Duration(i+1)*tl.Bin
				if at > end {
					break
				}
				if at > ru.Admitted {
					f.Held[i]++
				}
			}
		}
		end := len(tl.Bins)
		switch {
		case ru.Admitted >= 0:
			f.AdmittedPer[idx(ru.Admitted)]++
			end = idx(ru.Admitted)
		case ru.Left != nil:
			end = idx(*ru.Left)
		}
		for i := idx(ru.Joined); i < end; i++ {
			f.Waiting[i]++
		}
	}
	for _, h := range f.Held {
		f.PeakHeld = max(f.PeakHeld, h)
	}
	return f
}

// roomCharts draws the line: waiting, admitted per second, and the
// units held by admitted buyers.
func roomCharts(f *RoomFigures) []chart.Chart {
	x := chart.Axis{Label: fmt.Sprintf("time since the sale opened (s); bins of %s", f.Bin)}
	waiting := chart.Series{Name: "waiting (joined, not yet admitted)", Colour: "#4e79a7"}
	admitted := chart.Series{Name: "admitted", Colour: "#59a14f"}
	held := chart.Series{Name: "units held (admitted, not yet bought, the hold not ended)", Colour: "#f28e2b"}
	for i := range f.Waiting {
		at := (f.From + time.Duration(i)*f.Bin).Seconds()
		waiting.Points = append(waiting.Points, chart.Point{X: at, Y: float64(f.Waiting[i])})
		admitted.Points = append(admitted.Points, chart.Point{X: at, Y: float64(f.AdmittedPer[i]) / f.Bin.Seconds()})
		held.Points = append(held.Points, chart.Point{X: at + f.Bin.Seconds(), Y: float64(f.Held[i])})
	}
	open := []chart.Mark{{X: 0, Label: "sale opens", Colour: "#333"}}
	return []chart.Chart{
		{ID: "room-waiting", Title: "The line: buyers waiting", X: x, Y: chart.Axis{Label: "buyers"}, Series: []chart.Series{waiting}, Marks: open},
		{ID: "room-admitted", Title: "Admitted per second", X: x, Y: chart.Axis{Label: "buyers/s"}, Series: []chart.Series{admitted}, Marks: open},
		{ID: "room-held", Title: "Units held by admitted buyers", X: x, Y: chart.Axis{Label: "units"}, Series: []chart.Series{held}, Marks: open,
			Note: "at each bin's end, from admission to the order or the hold's end; bots poll rather than follow the stream, and are not seen admitted"},
	}
}
