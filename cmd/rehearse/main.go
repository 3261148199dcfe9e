// Command rehearse rehearses a flash sale against a running server: it
// makes a voucher of its own, logs a crowd of distinct users in through
// the API, drives them at the voucher in the shape of a real sale, checks
// the sale's invariants against the server's own answers, and writes a
// report to read afterwards: one HTML file that needs nothing else to
// open, and its data as JSON.
//
//	go run ./cmd/rehearse -base http://127.0.0.1:8080 -users 1000 -bots 20 -stock 100
//
// A load tool answers "how many requests a second"; a sale's team needs
// to know whether the sale was correct (no oversell, one order per user,
// every 200 an order, nothing sold before the window), whether it was
// fair (did the people who pressed first win; did bots win more than
// people), and where it hurt (answers and latency second by second). The
// crowd is in crowd.go, the invariants in checks.go, fairness in
// fairness.go, the seconds in series.go, the page in report.go.
//
// Several machines drive one sale by each running with -voucher ID (made
// beforehand) and users of their own (-first), then one of them merges
// their JSON: rehearse -merge -out all a.json b.json.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"seckill/loadtest/tokens/login"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "rehearse:", err)
		os.Exit(1)
	}
}

// errInvariant is returned, after the report is written, when the sale
// broke an invariant: a script (CI) running a rehearsal fails on it.
var errInvariant = errors.New("the sale broke an invariant (see the report's verdict strip)")

// config is the command line.
type config struct {
	shape      Shape
	bases      []string
	adminToken string
	adminPhone string
	tokens     string
	first      int64
	logins     int
	voucher    string
	out        string
	compare    string
	merge      bool
	label      string
	bin        time.Duration
	delta      time.Duration
	room       string
	settle     time.Duration
	drain      time.Duration
	files      []string // -merge's JSON files
}

func parse(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("rehearse", flag.ContinueOnError)
	fs.SetOutput(stderr)
	base := fs.String("base", "http://127.0.0.1:8080", "the server's base URL, or several, comma-separated (instances without a balancer): users are spread over them in turn")
	s := &c.shape
	fs.IntVar(&s.Users, "users", 1000, "people in the crowd, one account each")
	fs.IntVar(&s.Bots, "bots", 20, "bots in the crowd, one account each")
	fs.Int64Var(&s.Stock, "stock", 100, "units of the rehearsal's voucher")
	fs.DurationVar(&s.Lead, "lead", 3*time.Second, "people turn up over this stretch before the start")
	fs.Float64Var(&s.Early, "early", 0.15, "share of those who press as they turn up, before the start (told not_started)")
	fs.Float64Var(&s.Late, "late", 0.2, "share of people who turn up after the start instead")
	fs.DurationVar(&s.Tail, "tail", 2*time.Second, "the late ones turn up this long after the start, on average (each an exponential draw)")
	fs.DurationVar(&s.React, "react", 250*time.Millisecond, "a person's median reaction time, from the start or their arrival to the press")
	fs.Float64Var(&s.Honour, "honour", 0.8, "share of people who wait as Retry-After says")
	fs.Float64Var(&s.Again, "again", 0.2, "share of people who press once more as soon as they are told 200 (the server must answer already_ordered)")
	fs.IntVar(&s.Retries, "retries", 5, "retries a person makes after 429, 5xx or no answer before giving up")
	fs.DurationVar(&s.Backoff, "backoff", 100*time.Millisecond, "first backoff without Retry-After (doubling, full jitter)")
	fs.DurationVar(&s.BackoffMax, "backoff-max", 2*time.Second, "longest backoff")
	fs.DurationVar(&s.BotEvery, "bot-every", 50*time.Millisecond, "a bot's beat: its polls are due this far apart, however slow the answers (it ignores Retry-After)")
	fs.DurationVar(&s.BotLead, "bot-lead", time.Second, "bots start polling this long before the start")
	fs.IntVar(&s.BotConns, "bot-conns", 1, "requests a bot keeps in flight")
	fs.DurationVar(&s.Duration, "duration", 10*time.Second, "nothing is sent later than this after the start")
	fs.DurationVar(&s.Timeout, "timeout", 5*time.Second, "a request unanswered this long counts as no answer")
	fs.StringVar(&s.Conns, "conns", "user", "user: connections of its own per user (the start's connection storm is part of the test); shared: one pool")
	fs.Uint64Var(&s.Seed, "seed", 0, "the crowd's random seed (0: a new one); the same seed plans the same crowd")
	fs.IntVar(&s.RoomRate, "room-rate", 50, "with -room: the room admits this many buyers a second")
	fs.DurationVar(&s.RoomHold, "room-hold", 60*time.Second, "with -room: an admitted buyer's hold")
	fs.StringVar(&c.adminToken, "admin-token", "", "an admin's token, to make the voucher (default: log -admin-phone in, which needs the server's dev codes)")
	fs.StringVar(&c.adminPhone, "admin-phone", "13800000000", "the admin's phone, logged in with the code POST /auth/code answers")
	fs.StringVar(&c.tokens, "tokens", "", "a token file (go run ./loadtest/tokens writes one), instead of logging the crowd in")
	fs.Int64Var(&c.first, "first", 0, "the crowd's first phone; users get first, first+1, ... (0: a random block of 15xxxxxxxxx)")
	fs.IntVar(&c.logins, "logins", 16, "logins at once while the crowd is logged in")
	fs.StringVar(&c.voucher, "voucher", "", "drive this voucher instead of making one (several generators on one sale; merge their runs)")
	fs.StringVar(&c.out, "out", "", "write `PATH`.html and PATH.json (default rehearsal-<time>)")
	fs.StringVar(&c.compare, "compare", "", "draw an earlier run's JSON beside this one")
	fs.BoolVar(&c.merge, "merge", false, "merge the runs named as arguments (JSON of one voucher, one per generator) into one report")
	fs.StringVar(&c.label, "label", "", "what the run is called beside another (default: its start time)")
	fs.DurationVar(&c.bin, "bin", 0, "width of the report's time bins (0: a second, less for a short run)")
	fs.DurationVar(&c.delta, "delta", 0, "clicks closer than this count as ties in the fairness figures (0: only equal clicks; clicks are planned times, so their order is exact)")
	fs.DurationVar(&c.settle, "settle", 1500*time.Millisecond, "wait this long after the crowd before asking the server for its figures (its live counters land once a second)")
	fs.DurationVar(&c.drain, "drain", 30*time.Second, "after -settle, wait up to this long for the server to settle (async orders final, its queue empty), retrying what it answers 429, 5xx or not at all; what is still open then is reported unknown")
	fs.StringVar(&c.room, "room", "off", "off; on: the voucher has a waiting room; both: the same crowd twice, without and with one")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	c.files = fs.Args()
	if c.merge {
		if len(c.files) == 0 {
			return c, errors.New("-merge needs the runs' JSON files as arguments")
		}
		return c, nil
	}
	if len(c.files) > 0 {
		return c, fmt.Errorf("unexpected arguments %q (files are for -merge)", c.files)
	}
	for _, b := range strings.Split(*base, ",") {
		b = strings.TrimRight(strings.TrimSpace(b), "/")
		if u, err := url.Parse(b); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return c, fmt.Errorf("-base %q: not an http(s) URL", b)
		}
		c.bases = append(c.bases, b)
	}
	if err := c.validate(); err != nil {
		return c, err
	}
	// A deployment that is not this machine may be production: the
	// rehearsal would sign thousands of phones up on it (and send their
	// owners login codes, if its codes go by SMS), and log the admin's
	// phone in. Nothing of that happens by default there: say whose.
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, b := range c.bases {
		if loopback(b) {
			continue
		}
		switch {
		case !set["first"] && c.tokens == "":
			return c, fmt.Errorf("-base %s is not this machine: say which accounts the crowd is, with -tokens FILE (go run ./loadtest/tokens writes one) or -first PHONE (users -first to -first+%d are logged in, and made on first login)", b, s.Users+s.Bots-1)
		case c.adminToken == "" && c.voucher == "" && !set["admin-phone"]:
			return c, fmt.Errorf("-base %s is not this machine: give -admin-token, -voucher, or the admin's -admin-phone explicitly", b)
		}
	}
	if s.Seed == 0 {
		s.Seed = rand.Uint64()
	}
	if c.first == 0 {
		c.first = 15_000_000_000 + rand.Int64N(40_000)*100_000
	}
	n := int64(s.Users + s.Bots)
	if c.room == "both" {
		n *= 2 // the second crowd follows the first
	}
	if c.first < 10_000_000_000 || c.first+n-1 > 19_999_999_999 {
		return c, fmt.Errorf("-first %d: the crowd's phones, -first to -first+%d, must be 11-digit numbers starting with 1", c.first, n-1)
	}
	if c.out == "" {
		c.out = "rehearsal-" + time.Now().Format("20060102-150405")
	}
	return c, nil
}

// validate refuses flags that cannot make a sale, each with what is wrong.
func (c config) validate() error {
	s := c.shape
	share := func(name string, v float64) error {
		if v < 0 || v > 1 {
			return fmt.Errorf("-%s %g: a share, from 0 to 1", name, v)
		}
		return nil
	}
	switch {
	case s.Users < 0 || s.Bots < 0 || s.Users+s.Bots == 0:
		return fmt.Errorf("-users %d, -bots %d: at least one user, and neither negative", s.Users, s.Bots)
	case c.voucher == "" && s.Stock < 1:
		return fmt.Errorf("-stock %d: the rehearsal's voucher needs at least one unit", s.Stock)
	case c.voucher == "" && s.Stock > int64(s.Users+s.Bots):
		return fmt.Errorf("-stock %d is more than the crowd (%d users and bots): everyone would win and the sale would never sell out; give fewer units or more users", s.Stock, s.Users+s.Bots)
	case c.voucher != "" && strings.Trim(c.voucher, "0123456789") != "":
		return fmt.Errorf("-voucher %q: a voucher ID is decimal digits", c.voucher)
	case s.Conns != "user" && s.Conns != "shared":
		return errors.New("-conns is user or shared")
	case c.room != "off" && c.room != "on" && c.room != "both":
		return errors.New("-room is off, on or both")
	case s.React <= 0 || s.BotEvery <= 0 || s.Backoff <= 0 || s.BackoffMax < s.Backoff || s.Timeout <= 0 || s.Duration <= 0:
		return errors.New("-react, -bot-every, -backoff, -timeout and -duration must be positive, and -backoff-max at least -backoff")
	case s.Lead < 0 || s.Tail < 0 || s.BotLead < 0 || c.settle < 0 || c.drain < 0 || c.delta < 0 || c.bin < 0:
		return errors.New("-lead, -tail, -bot-lead, -settle, -drain, -delta and -bin must not be negative")
	case s.Retries < 0 || s.BotConns < 1 || c.logins < 1:
		return fmt.Errorf("-retries %d, -bot-conns %d, -logins %d: retries at least 0, the others at least 1", s.Retries, s.BotConns, c.logins)
	case c.room != "off" && (s.RoomRate < 1 || s.RoomRate > 100_000):
		return fmt.Errorf("-room-rate %d: from 1 to 100000 a second", s.RoomRate)
	case c.room != "off" && (s.RoomHold < 5*time.Second || s.RoomHold > time.Hour || s.RoomHold%time.Second != 0):
		return fmt.Errorf("-room-hold %s: whole seconds, from 5s to 1h", s.RoomHold)
	}
	return errors.Join(share("early", s.Early), share("late", s.Late), share("honour", s.Honour), share("again", s.Again))
}

// loopback reports whether base names this machine.
func loopback(base string) bool {
	u, err := url.Parse(base)
	if err != nil {
		return false
	}
	h := u.Hostname()
	if h == "localhost" || strings.HasSuffix(h, ".localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// run is the command: parse, rehearse (or merge), report.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c, err := parse(args, stderr)
	if err != nil {
		return err
	}
	var earlier *Run
	if c.compare != "" {
		if earlier, err = load(c.compare); err != nil {
			return err
		}
	}
	if c.merge {
		var runs []*Run
		for _, f := range c.files {
			r, err := load(f)
			if err != nil {
				return err
			}
			runs = append(runs, r)
		}
		r, err := merge(runs)
		if err != nil {
			return err
		}
		return finish(r, earlier, c, stdout)
	}
	if c.room == "both" {
		// The same crowd (the same seed) twice, on two vouchers: without
		// the room, then with it, the first drawn beside the second. The
		// admin logs in once: a phone gets one code a minute.
		if c.adminToken == "" && c.voucher == "" {
			if c.adminToken, err = adminLogin(ctx, c); err != nil {
				return err
			}
		}
		cOff, cOn := c, c
		cOff.room, cOff.out, cOff.label = "off", c.out+"-without-room", "without a room"
		cOn.room, cOn.out, cOn.label = "on", c.out+"-with-room", "with a room"
		cOn.first += int64(c.shape.Users + c.shape.Bots)
		without, err := rehearse(ctx, cOff, stderr)
		if err != nil {
			return err
		}
		errOff := finish(without, earlier, cOff, stdout)
		with, err := rehearse(ctx, cOn, stderr)
		if err != nil {
			return err
		}
		return errors.Join(errOff, finish(with, without, cOn, stdout))
	}
	r, err := rehearse(ctx, c, stderr)
	if err != nil {
		return err
	}
	return finish(r, earlier, c, stdout)
}

// rehearse runs one sale: accounts, voucher, crowd, and the server's
// answers afterwards.
func rehearse(ctx context.Context, c config, logw io.Writer) (*Run, error) {
	logf := func(format string, args ...any) { fmt.Fprintf(logw, "rehearse: "+format+"\n", args...) }
	plain := &http.Client{Timeout: 30 * time.Second, Transport: transport(64)}
	defer plain.CloseIdleConnections()
	s := c.shape
	n := s.Users + s.Bots
	started := time.Now()
	var err error

	// The admin first: a phone gets one login code a minute, and a second
	// rehearsal within the minute should fail before the crowd logs in.
	admin := c.adminToken
	if admin == "" && c.voucher == "" {
		if admin, err = adminLogin(ctx, c); err != nil {
			return nil, err
		}
	}

	// The crowd's accounts: distinct users, one per simulated buyer, as a
	// real crowd is (a second order of one user is refused).
	var accounts []account
	if c.tokens != "" {
		accounts, err = readTokens(c.tokens, n)
	} else {
		logf("logging %d users in (phones %d to %d) through %s", n, c.first, c.first+int64(n)-1, c.bases[0])
		accounts, err = logIn(ctx, plain, c.bases, c.first, n, c.logins)
	}
	if err != nil {
		return nil, err
	}
	logf("%d users logged in in %s", n, time.Since(started).Round(time.Millisecond))

	// The voucher: the rehearsal's own, opening once everyone has had
	// time to turn up, in whole seconds as the server keeps them.
	var v voucherJSON
	if c.voucher != "" {
		v, err = getVoucher(ctx, plain, c.bases[0], c.voucher)
		if err == nil && time.Until(v.Begin) < s.Lead {
			err = fmt.Errorf("voucher %s opens at %s, in %s: less than -lead (%s) away", v.ID, v.Begin.Format(time.RFC3339), time.Until(v.Begin).Round(time.Second), s.Lead)
		}
	} else {
		begin := time.Now().Add(max(s.Lead, s.BotLead) + time.Second).Truncate(time.Second).Add(time.Second)
		var room *roomJSON
		if c.room == "on" {
			room = &roomJSON{OpensAt: time.Now().Truncate(time.Second), AdmitPerSecond: s.RoomRate, HoldFor: int(s.RoomHold.Seconds())}
		}
		title := fmt.Sprintf("rehearsal %s, %d users, %d bots", started.Format("2006-01-02 15:04:05"), s.Users, s.Bots)
		v, err = makeVoucher(ctx, plain, c.bases[0], admin, title, s.Stock, begin, begin.Add(time.Hour), room)
	}
	if err != nil {
		return nil, fmt.Errorf("voucher: %w", err)
	}
	logf("voucher %s: %d units, opens at %s", v.ID, v.Stock, v.Begin.Format("15:04:05"))

	r := &Run{
		Version: runVersion, Label: c.label, Started: started, Bases: c.bases, Shape: s, Shared: c.voucher != "",
		Voucher: Voucher{ID: v.ID, Stock: v.Stock, Begin: v.Begin, End: v.End, Room: v.Room != nil},
	}
	if r.Label == "" {
		r.Label = started.Format("2006-01-02 15:04:05")
	}
	plans := planCrowd(s)
	for u, p := range plans {
		p.user.ID, p.user.Base = accounts[u].ID, u%len(c.bases)
		r.Users = append(r.Users, p.user)
	}
	// The run's clock counts from begin_time, with this process'
	// monotonic clock: now plus the wall clock's distance to it.
	now := time.Now()
	d := &driver{shape: s, bases: c.bases, voucher: v.ID, accounts: accounts, t0: now.Add(v.Begin.Sub(now))}
	cpu0, wall0 := cpuTime(), time.Now()
	logf("the crowd: %d people and %d bots, until %s after the start", s.Users, s.Bots, s.Duration)
	if r.Voucher.Room {
		r.Attempts, r.Room = d.driveRoom(ctx, plans, r.Users)
	} else {
		r.Attempts = d.drive(ctx, plans, r.Users)
	}
	r.Machines = []Machine{machine(n, cpuTime()-cpu0, time.Since(wall0))}
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	logf("asking the server about %d answers of 200", countIf(r.Attempts, Attempt.sold))
	r.After = after(ctx, plain, c.bases[0], r, accounts, d, c.settle, c.drain)
	return r, nil
}

// adminLogin logs the admin's phone in with the code the server answers
// (its dev codes on), for a token that may make the voucher.
func adminLogin(ctx context.Context, c config) (string, error) {
	cl := &http.Client{Timeout: 30 * time.Second}
	defer cl.CloseIdleConnections()
	a, err := login.One(ctx, cl, c.bases[0], strings.TrimSpace(c.adminPhone))
	if err != nil {
		return "", fmt.Errorf("log the admin in (or give -admin-token; go run ./loadtest/tokens -first %s -n 1 writes one): %w", c.adminPhone, err)
	}
	return a.Token, nil
}
