package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"
)

// A Run is everything one rehearsal saw: what it was asked to do, every
// request it sent with what came back, and what the server said about the
// sale afterwards. The report is computed from a Run alone (analyse), never
// from the driver's memory, so that the runs of several machines can be
// merged into one report and an earlier run drawn beside a later one.
//
// Every time in it is a duration since the voucher's begin_time on the
// generator's clock (negative before the sale opens), in nanoseconds in
// the JSON: one clock for every figure, and the moment that matters as 0.
type Run struct {
	Version  int       `json:"version"`
	Label    string    `json:"label"`    // what the run is called in a comparison
	Started  time.Time `json:"started"`  // wall clock when the rehearsal began
	Bases    []string  `json:"bases"`    // the server(s) driven, users spread over them in turn
	Voucher  Voucher   `json:"voucher"`  // the rehearsal's own voucher
	Shared   bool      `json:"shared"`   // the voucher was given (-voucher): other generators may be selling it too
	Shape    Shape     `json:"shape"`    // the traffic it was asked to make
	Machines []Machine `json:"machines"` // the generators: one, or one per merged run
	Users    []User    `json:"users"`
	Attempts []Attempt `json:"attempts"`
	After    After     `json:"after"` // the server's answers after the run
	Room     *RoomLine `json:"room,omitempty"`

	byUser [][]Attempt // each user's attempts in order sent, built by attemptsOf
}

// runVersion changes when Run's meaning does; -compare and -merge refuse
// another.
const runVersion = 1

// A Voucher is the rehearsal's voucher as the server created it.
type Voucher struct {
	ID    string    `json:"id"`
	Stock int64     `json:"stock"` // the initial stock
	Begin time.Time `json:"begin_time"`
	End   time.Time `json:"end_time"`
	Room  bool      `json:"room"` // it has a waiting room
}

// A Machine is one generator: how hard it worked, to say whether its
// figures can be trusted (a generator that fell behind sent its crowd
// late, and the server looks better than it is).
type Machine struct {
	Host  string        `json:"host"`
	Cores int           `json:"cores"`
	CPU   time.Duration `json:"cpu"`  // CPU time this process used from the first press to the last answer
	Wall  time.Duration `json:"wall"` // that stretch of real time
	Users int           `json:"users"`
}

// Kinds of simulated user.
const (
	person = "person"
	bot    = "bot"
)

// A User is one simulated buyer, one account on the server.
type User struct {
	ID      string        `json:"id"` // the server's user ID
	Kind    string        `json:"kind"`
	Honours bool          `json:"honours_retry_after"` // waits as Retry-After says (people, mostly); bots never do
	Again   bool          `json:"again,omitempty"`     // presses once more at once after a 200
	Arrive  time.Duration `json:"arrive"`              // when they turned up
	Machine int           `json:"machine"`             // index in Run.Machines
	Base    int           `json:"base"`                // index in Run.Bases: the server they press
}

// An Attempt is one request to the buy button (or, with a waiting room,
// to join it). Due is when it should have left: for a first press, the
// schedule made before the run; for a person's retry, the answer before
// it plus the wait; for a bot's poll, its beat. Latency is timed from
// Due, not Sent, so that neither a generator that falls behind nor a bot
// waiting on its connection can hide a slow server (coordinated
// omission). Held is how long past Due it waited for the answer before
// it on its connection (a bot's poll; the server's doing); what is left
// of Sent − Due is the generator's own lateness, reported on its own.
type Attempt struct {
	User       int           `json:"user"` // index in Run.Users
	Try        int           `json:"try"`  // 0 for the user's first
	Due        time.Duration `json:"due"`
	Held       time.Duration `json:"held,omitempty"`
	Sent       time.Duration `json:"sent"`
	Done       time.Duration `json:"done"`
	Status     int           `json:"status"` // HTTP status; 0: no answer
	Code       string        `json:"code"`   // "ok", the error's code, or timeout, conn_error, http_NNN
	RetryAfter time.Duration `json:"retry_after,omitempty"`
	Order      string        `json:"order,omitempty"` // a 200's order_id
	Kind       string        `json:"kind,omitempty"`  // "" a press; "join" a waiting-room join
	Err        string        `json:"error,omitempty"` // why there was no answer
}

// Codes the generator gives answers that carry none of the server's.
const (
	codeOK        = "ok"
	codeTimeout   = "timeout"    // no answer within -timeout
	codeConnError = "conn_error" // the connection failed or was closed
)

// sold reports whether the attempt was a press answered 200: a sale.
func (a Attempt) sold() bool { return a.Kind == "" && a.Status == 200 }

func (a Attempt) latency() time.Duration  { return a.Done - a.Due }
func (a Attempt) lateness() time.Duration { return a.Sent - a.Due - a.Held }

// unanswered reports whether the request may or may not have been
// served: the server may have taken a unit and never said so.
func (a Attempt) unanswered() bool { return a.Status == 0 || a.Status >= 500 }

// After is what the server answered once the crowd was gone.
type After struct {
	// Stock is GET /vouchers/{id}'s stock (what Redis will still sell);
	// StockErr says why it could not be read.
	Stock    int64  `json:"stock"`
	StockErr string `json:"stock_error,omitempty"`
	// Live is the voucher's figures from GET /live/{id}/events, the
	// server's own count of its orders and answers; nil where the server
	// has no live page (LiveErr says why).
	Live      *Figures `json:"live,omitempty"`
	LiveErr   string   `json:"live_error,omitempty"`
	LiveOpens int      `json:"live_opens"` // streams opened to read them
	// Orders holds GET /orders/{id} for every order ID a 200 carried, asked
	// with its buyer's token until the order was final (see after.go).
	Orders []OrderSeen `json:"orders"`
	// Probes are each winner's press after the sale.
	Probes []Probe `json:"probes"`
	// Read is when this was read, on the run's clock: of merged runs, the
	// last reading is the truest.
	Read time.Duration `json:"read"`
}

// Figures are the fields of the live page's figures the checks read
// (docs/api.md, GET /live/{voucherId}/events).
type Figures struct {
	Initial   int64            `json:"initial"`
	RedisLeft *int64           `json:"redis_left"`
	MySQLLeft int64            `json:"mysql_left"`
	Orders    int64            `json:"orders"`
	Holds     bool             `json:"invariant_holds"`
	Total     map[string]int64 `json:"total"`
	Queue     *int64           `json:"queue"`
}

// OrderSeen is one GET /orders/{id}: the server's word on a 200.
type OrderSeen struct {
	ID      string    `json:"id"`
	User    int       `json:"user"`   // whose 200 carried it (index in Run.Users)
	Status  int       `json:"status"` // of the GET: 200, 404 for an order that does not exist, 0 for no answer
	Owner   string    `json:"user_id,omitempty"`
	Voucher string    `json:"voucher_id,omitempty"`
	State   string    `json:"state,omitempty"` // the order's status: pending, unpaid, ...
	Created time.Time `json:"created_at"`
	Err     string    `json:"error,omitempty"`
}

// load reads a Run written by an earlier rehearsal.
func load(path string) (*Run, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r Run
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if r.Version != runVersion {
		return nil, fmt.Errorf("%s: a run of version %d; this rehearse reads version %d", path, r.Version, runVersion)
	}
	return &r, nil
}

// sameSale returns an error unless a and b drove one sale the same way:
// one voucher, as the server made it, and one crowd's shape, but for
// each generator's own numbers (its users, bots and seed; -stock, which
// a generator on a given voucher does not use).
func sameSale(a, b *Run) error {
	va, vb := a.Voucher, b.Voucher
	if va.ID != vb.ID || va.Stock != vb.Stock || va.Room != vb.Room || !va.Begin.Equal(vb.Begin) || !va.End.Equal(vb.End) {
		return fmt.Errorf("not one sale: voucher %+v and %+v", a.Voucher, b.Voucher)
	}
	sa, sb := a.Shape, b.Shape
	for _, s := range []*Shape{&sa, &sb} {
		s.Users, s.Bots, s.Seed, s.Stock = 0, 0, 0, 0
	}
	if sa != sb {
		return fmt.Errorf("not one crowd: flags %+v and %+v (only -users, -bots, -seed and -first may differ between generators)", sa, sb)
	}
	return nil
}

// merge joins the runs of several generators that drove one voucher at
// once (each with -voucher and users of its own) into one run, as if one
// machine had made the whole crowd. Their clocks are each their own,
// counted from the one begin_time: keep them in sync (NTP) to within
// what the report's figures need.
func merge(runs []*Run) (*Run, error) {
	if len(runs) == 0 {
		return nil, fmt.Errorf("nothing to merge")
	}
	out := *runs[0]
	out.Users, out.Attempts, out.Machines, out.After.Orders, out.After.Probes = nil, nil, nil, nil, nil
	out.Shared = false
	latest := runs[0]
	owner := map[string]int{} // user ID -> the run that had them
	for i, r := range runs {
		if err := sameSale(runs[0], r); err != nil {
			return nil, fmt.Errorf("runs 1 and %d: %w", i+1, err)
		}
		for _, u := range r.Users {
			if j, ok := owner[u.ID]; ok && j != i {
				return nil, fmt.Errorf("user %s is in runs %d and %d: give each generator users of its own (-first, or a token file each)", u.ID, j+1, i+1)
			}
			owner[u.ID] = i
		}
		users, machines := len(out.Users), len(out.Machines)
		for _, u := range r.Users {
			u.Machine += machines
			out.Users = append(out.Users, u)
		}
		for _, a := range r.Attempts {
			a.User += users
			out.Attempts = append(out.Attempts, a)
		}
		for _, o := range r.After.Orders {
			o.User += users
			out.After.Orders = append(out.After.Orders, o)
		}
		for _, p := range r.After.Probes {
			p.User += users
			out.After.Probes = append(out.After.Probes, p)
		}
		out.Machines = append(out.Machines, r.Machines...)
		if r.Started.Add(r.After.Read).After(latest.Started.Add(latest.After.Read)) {
			latest = r
		}
	}
	out.After.Stock, out.After.StockErr, out.After.Live, out.After.LiveErr, out.After.Read =
		latest.After.Stock, latest.After.StockErr, latest.After.Live, latest.After.LiveErr, latest.After.Read
	return &out, nil
}
