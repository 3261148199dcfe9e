package main

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// quick is a small, short crowd: 60 people and 4 bots after 20 units,
// the sale opening a second or two after the voucher is made. The
// timeout is long: on a machine busy with other tests the generator can
// be starved for seconds, and an unanswered request is ambiguous (it may
// have bought), which would blur what the tests look for.
var quick = []string{"-users", "60", "-bots", "4", "-stock", "20", "-lead", "300ms", "-bot-lead", "200ms",
	"-duration", "1500ms", "-timeout", "20s", "-settle", "0", "-admin-token", fakeAdmin, "-seed", "7"}

// rehearseAgainst runs the command against srv with quick and extra
// flags, and returns the run it wrote, what was made of it, and run's error.
func rehearseAgainst(t *testing.T, srv *httptest.Server, extra ...string) (*Run, Analysis, error) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "r")
	args := append(append([]string{"-base", srv.URL, "-out", out}, quick...), extra...)
	var stdout, stderr bytes.Buffer
	err := run(t.Context(), args, &stdout, &stderr)
	if err != nil && !errors.Is(err, errInvariant) {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	t.Logf("%s", stdout.String())
	r, lerr := load(out + ".json")
	if lerr != nil {
		t.Fatal(lerr)
	}
	if _, serr := os.Stat(out + ".html"); serr != nil {
		t.Fatal(serr)
	}
	return r, analyse(r, 0, 0), err
}

func verdicts(an Analysis) map[string]string {
	out := map[string]string{}
	for _, c := range an.Checks {
		out[c.Name] = c.Verdict
	}
	return out
}

// TestHonestSale: a server that keeps its promises passes every check,
// sells its stock, and tells the early pressers not_started.
func TestHonestSale(t *testing.T) {
	t.Parallel()
	r, an, err := rehearseAgainst(t, newFakeServer(t, nil))
	if err != nil {
		t.Errorf("run: %v", err)
	}
	for name, v := range verdicts(an) {
		if v != pass {
			t.Errorf("%s: %s", name, v)
		}
	}
	if an.Wins != 20 {
		t.Errorf("%d orders, want the stock, 20", an.Wins)
	}
	if an.Totals["409 not_started"] == 0 {
		t.Errorf("nobody was told not_started: the early presses and the bots' lead are missing")
	}
	if len(r.Users) != 64 || r.Users[63].Kind != bot {
		t.Errorf("users: %d, the last a %s; want 64, the last a bot", len(r.Users), r.Users[63].Kind)
	}
}

// TestLiesCaught: each lie of a server is caught by its check, and the
// command fails.
func TestLiesCaught(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		lie   func(*fakeServer)
		check string
	}{
		{"200 without an order", func(f *fakeServer) { f.noOrderEvery = 4 }, "every 200 an order"},
		{"order after a 429", func(f *fakeServer) { f.busyOrderEvery = 3 }, "no order after a refusal"},
		{"order after a 429, no live figures", func(f *fakeServer) { f.busyOrderEvery, f.withoutLiveFigs = 3, true }, "no order after a refusal"},
		{"order after sold_out", func(f *fakeServer) { f.soldOutOrder = true }, "no order after a refusal"},
		{"oversell", func(f *fakeServer) { f.oversell = 5 }, "no oversell"},
		{"200 without an order, no live figures", func(f *fakeServer) { f.noOrderEvery, f.withoutLiveFigs = 4, true }, "stock + orders = initial"},
		{"async orders that end failed", func(f *fakeServer) { f.pendingFor, f.failEvery = time.Second, 5 }, "every 200 an order"},
		{"two orders of one user", func(f *fakeServer) { f.twoPerUser = true }, "one order per user"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, an, err := rehearseAgainst(t, newFakeServer(t, tc.lie))
			if !errors.Is(err, errInvariant) {
				t.Errorf("run returned %v, want errInvariant", err)
			}
			if v := verdicts(an)[tc.check]; v != fail {
				t.Errorf("%q: %s, want fail; checks: %+v", tc.check, v, an.Checks)
			}
		})
	}
}

// TestAsyncOrdersReadOnceFinal: in async mode an order reads pending
// for a second before it is in MySQL. The rehearsal waits for every one
// to be final before it judges, and waits for the queue to empty on one
// live stream, within the server's limit on opening them.
func TestAsyncOrdersReadOnceFinal(t *testing.T) {
	t.Parallel()
	var fake *fakeServer
	srv := newFakeServer(t, func(f *fakeServer) {
		fake = f
		f.pendingFor, f.liveOpenEvery = 1500*time.Millisecond, 2*time.Second
	})
	r, an, err := rehearseAgainst(t, srv)
	if err != nil {
		t.Errorf("run: %v", err)
	}
	for name, v := range verdicts(an) {
		if v != pass {
			t.Errorf("%s: %s", name, v)
		}
	}
	for _, o := range r.After.Orders {
		if o.State != "unpaid" {
			t.Errorf("order %s read %q, want unpaid (final)", o.ID, o.State)
		}
	}
	if l := r.After.Live; l == nil || l.Queue == nil || *l.Queue != 0 || r.After.LiveErr != "" {
		t.Errorf("live figures %+v (error %q), want them read with the queue empty", l, r.After.LiveErr)
	}
	fake.mu.Lock()
	defer fake.mu.Unlock()
	if fake.liveRefused > 0 || r.After.LiveOpens != fake.liveOpens {
		t.Errorf("live streams: %d opened (%d by the rehearsal's count), %d refused 429; want none refused", fake.liveOpens, r.After.LiveOpens, fake.liveRefused)
	}
}

// TestOrderLookupsRetried: GET /orders answers 503 twice for each order
// before it answers: the lookups are retried and every check passes.
// When it answers nothing but 503, the order's check is unknown, not a
// failure, and the run does not fail.
func TestOrderLookupsRetried(t *testing.T) {
	t.Parallel()
	t.Run("flaky", func(t *testing.T) {
		t.Parallel()
		_, an, err := rehearseAgainst(t, newFakeServer(t, func(f *fakeServer) { f.ordersFlaky = 2 }))
		if err != nil {
			t.Errorf("run: %v", err)
		}
		for name, v := range verdicts(an) {
			if v != pass {
				t.Errorf("%s: %s", name, v)
			}
		}
	})
	t.Run("down", func(t *testing.T) {
		t.Parallel()
		_, an, err := rehearseAgainst(t, newFakeServer(t, func(f *fakeServer) { f.ordersDown = true }), "-drain", "1s")
		if err != nil {
			t.Errorf("run: %v, want no failure: the server said nothing", err)
		}
		if v := verdicts(an)["every 200 an order"]; v != unknown {
			t.Errorf("every 200 an order: %s, want unknown", v)
		}
		for name, v := range verdicts(an) {
			if v == fail {
				t.Errorf("%s: fail", name)
			}
		}
	})
}

// TestUnansweredSalesWithoutLiveFigures: every fifth sale is answered
// after the client gave up, and the server has no live figures. The
// units those requests took are accounted for by the requests left
// unanswered: stock + orders = initial passes on the range it can
// check, rather than failing an equality that cannot hold.
func TestUnansweredSalesWithoutLiveFigures(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, func(f *fakeServer) { f.withoutLiveFigs, f.hangEvery, f.hangFor = true, 5, time.Second })
	r, an, _ := rehearseAgainst(t, srv, "-timeout", "300ms", "-retries", "0")
	if r.After.Live != nil {
		t.Fatal("live figures read from a server without them")
	}
	if n := countIf(r.Attempts, func(a Attempt) bool { return a.Code == codeTimeout }); n == 0 {
		t.Fatal("no request went unanswered")
	}
	for name, v := range verdicts(an) {
		if v != pass {
			t.Errorf("%s: %s", name, v)
		}
	}
}

// TestStallShowsInLatency: the server holds every request that arrives
// in the first 600 ms of the sale until then. Each request due in the
// stall is answered no sooner than its end, so its latency, timed from
// when it was due, is at least the rest of the stall: whether the
// generator sent it on time (the server held it) or late (the generator
// was held, and its lateness counts). A generator that timed from the
// send, or waited for answers before sending more, would show less.
func TestStallShowsInLatency(t *testing.T) {
	t.Parallel()
	const stall = 600 * time.Millisecond
	_, an, _ := rehearseAgainst(t, newFakeServer(t, func(f *fakeServer) { f.stallFrom, f.stallTo = 0, stall }), "-bin", "100ms")
	checked := 0
	for _, b := range an.Timeline.Bins {
		end := b.At + an.Timeline.Bin
		if b.At < 0 || end > stall || b.OK.N+b.Refused.N == 0 {
			continue
		}
		checked++
		for _, p := range []Percentiles{b.OK, b.Refused} {
			// The fastest of them, due at the bin's end at the latest,
			// waited until the stall ended.
			if p.N > 0 && p.P50 < stall-end {
				t.Errorf("requests due at %s: p50 %s, want at least %s (the rest of the stall)", secs(b.At), p.P50, stall-end)
			}
		}
	}
	if checked < 3 {
		t.Errorf("only %d bins of the stall had requests due", checked)
	}
	if an.Refused.P90 < 100*time.Millisecond && an.OK.P90 < 100*time.Millisecond {
		t.Errorf("p90s %s and %s: the stall is missing from the percentiles", an.OK.P90, an.Refused.P90)
	}
	t.Logf("generator lateness p99 %s", an.Late.P99)
}

// TestBotsPollOnTheirBeat: the server holds every request that arrives
// from 150 ms before the start to 300 ms after it. A bot's polls stay on
// its beat (each due -bot-every after the one before), those due while
// the held one was out leave when it comes back, and are timed from
// when they were due: the wait is in their latency, and it is not
// counted as the generator's lateness.
func TestBotsPollOnTheirBeat(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, func(f *fakeServer) { f.stallFrom, f.stallTo = -150*time.Millisecond, 300*time.Millisecond })
	r, _, _ := rehearseAgainst(t, srv, "-bot-every", "50ms")
	held := 0
	for u, user := range r.Users {
		if user.Kind != bot {
			continue
		}
		as := attemptsOf(r, u)
		for i := 1; i < len(as); i++ {
			if gap := as[i].Due - as[i-1].Due; gap != 50*time.Millisecond {
				t.Errorf("bot %d: poll %d due %s after the one before, want 50ms", u, i, gap)
			}
			if as[i].Held > 0 {
				held++
				if lat := as[i].latency(); lat < as[i].Held {
					t.Errorf("bot %d: poll %d held %s, latency only %s", u, i, as[i].Held, lat)
				}
				if want := as[i-1].Done - as[i].Due; as[i].Held != want {
					t.Errorf("bot %d: poll %d held %s, want %s (until the answer before it)", u, i, as[i].Held, want)
				}
			}
		}
	}
	if held == 0 {
		t.Error("no bot's poll waited on the stalled one before it")
	}
}

// TestReportIsSelfContained: the page fetches nothing: no script, no
// link, no URL but the servers' own in the text.
func TestReportIsSelfContained(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, nil)
	out := filepath.Join(t.TempDir(), "r")
	var stdout bytes.Buffer
	if err := run(t.Context(), append([]string{"-base", srv.URL, "-out", out}, quick...), &stdout, &stdout); err != nil {
		t.Fatal(err, stdout.String())
	}
	b, err := os.ReadFile(out + ".html")
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	for _, bad := range []string{"<script", "<link", "src=", "@import", "url(http"} {
		if strings.Contains(page, bad) {
			t.Errorf("the report holds %q", bad)
		}
	}
	for _, id := range []string{"answers", "latency-ok", "latency-refused", "arrivals", "in-flight", "lateness", "fairness"} {
		if !strings.Contains(page, `data-chart="`+id+`"`) {
			t.Errorf("chart %s missing", id)
		}
	}
}

// TestMergeTwoGenerators: two generators drive one voucher, made
// beforehand, each with users of its own; each alone cannot check the
// server's totals (unknown, not a failure), and their merged run passes
// every check with the whole stock sold once.
func TestMergeTwoGenerators(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, nil)
	begin := time.Now().Add(2 * time.Second).Truncate(time.Second).Add(time.Second)
	v, err := makeVoucher(t.Context(), srv.Client(), srv.URL, fakeAdmin, "shared", 20, begin, begin.Add(time.Hour), nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	errs := make(chan error, 2)
	for i, first := range []string{"15000000000", "15000001000"} {
		go func() {
			var out bytes.Buffer
			args := append([]string{"-base", srv.URL, "-voucher", v.ID, "-first", first, "-out", filepath.Join(dir, fmt.Sprint(i)), "-label", first}, quick...)
			err := run(t.Context(), args, &out, &out)
			if err != nil {
				err = fmt.Errorf("%w\n%s", err, out.String())
			}
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	one, err := load(filepath.Join(dir, "0.json"))
	if err != nil {
		t.Fatal(err)
	}
	if v := verdicts(analyse(one, 0, 0))["stock + orders = initial"]; v != unknown && v != pass {
		t.Errorf("one generator of two: stock + orders = initial is %s, want unknown (or pass, from the live figures)", v)
	}
	var out bytes.Buffer
	all := filepath.Join(dir, "all")
	if err := run(t.Context(), []string{"-merge", "-out", all, filepath.Join(dir, "0.json"), filepath.Join(dir, "1.json")}, &out, &out); err != nil {
		t.Fatal(err, out.String())
	}
	r, err := load(all + ".json")
	if err != nil {
		t.Fatal(err)
	}
	an := analyse(r, 0, 0)
	for name, v := range verdicts(an) {
		if v != pass {
			t.Errorf("merged: %s is %s", name, v)
		}
	}
	if len(r.Users) != 128 || len(r.Machines) != 2 || an.Wins != 20 {
		t.Errorf("merged: %d users, %d machines, %d orders; want 128, 2, 20", len(r.Users), len(r.Machines), an.Wins)
	}
}

// TestFlagsRefused: flags that cannot make a sale, or that would log a
// crowd in on a deployment elsewhere without being told whose phones to
// use, are refused with what is wrong.
func TestFlagsRefused(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // in the error; "" for none
	}{
		{[]string{"-admin-token", "x"}, ""},
		{[]string{"-users", "-1"}, "-users"},
		{[]string{"-users", "0", "-bots", "0"}, "at least one user"},
		{[]string{"-stock", "0"}, "at least one unit"},
		{[]string{"-users", "10", "-bots", "0", "-stock", "11"}, "more than the crowd"},
		{[]string{"-voucher", "42", "-users", "10", "-bots", "0", "-stock", "11"}, ""}, // -stock is the voucher's
		{[]string{"-voucher", "4x"}, "decimal digits"},
		{[]string{"-early", "1.5"}, "-early"},
		{[]string{"-again", "-0.1"}, "-again"},
		{[]string{"-retries", "-1"}, "-retries"},
		{[]string{"-logins", "0"}, "-logins"},
		{[]string{"-bot-conns", "0"}, "-bot-conns"},
		{[]string{"-lead", "-1s"}, "must not be negative"},
		{[]string{"-delta", "-1ms"}, "must not be negative"},
		{[]string{"-room", "on", "-room-hold", "2s"}, "-room-hold"},
		{[]string{"-room", "on", "-room-rate", "0"}, "-room-rate"},
		{[]string{"-first", "19999999999", "-users", "2", "-bots", "0", "-stock", "1"}, "11-digit"},
		{[]string{"-base", "https://sale.example.com", "-admin-token", "x"}, "-first PHONE"},
		{[]string{"-base", "https://sale.example.com", "-first", "15000000000"}, "-admin-token"},
		{[]string{"-base", "https://sale.example.com", "-first", "15000000000", "-admin-token", "x"}, ""},
		{[]string{"-base", "http://127.0.0.1:8080,https://10.0.0.7", "-tokens", "t.txt", "-voucher", "42"}, ""},
		{[]string{"-base", "http://[::1]:8080,http://localhost:8081"}, ""},
	} {
		_, err := parse(tc.args, io.Discard)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v", tc.args, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: error %v, want one saying %q", tc.args, err, tc.want)
		}
	}
}

// TestTokenFileOfOneUserTwice: a token file that holds two tokens of
// one user is refused: they would be one buyer, not two.
func TestTokenFileOfOneUserTwice(t *testing.T) {
	tok := func(sub string) string {
		return "e30." + base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"`+sub+`"}`)) + ".sig"
	}
	path := filepath.Join(t.TempDir(), "tokens.txt")
	if err := os.WriteFile(path, []byte(tok("1")+"\n"+tok("2")+"\n\n"+tok("1")+"x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readTokens(path, 2); err != nil {
		t.Errorf("the first two tokens: %v", err)
	}
	_, err := readTokens(path, 3)
	if err == nil || !strings.Contains(err.Error(), "line 4: a token of user 1, as on line 1") {
		t.Errorf("error %v, want one naming lines 4 and 1", err)
	}
}

// TestMergeRefusesOtherSales: runs of another voucher, of another crowd's
// shape, or sharing a user are not merged.
func TestMergeRefusesOtherSales(t *testing.T) {
	run := func(first int) *Run {
		r := line("WL")
		r.Version = runVersion
		r.Voucher.ID, r.Voucher.Begin = "42", time.Unix(1_800_000_000, 0)
		r.Shape = Shape{Users: 2, BotEvery: 50 * time.Millisecond, Seed: uint64(first)}
		for i := range r.Users {
			r.Users[i].ID = fmt.Sprint(first + i)
		}
		return r
	}
	if _, err := merge([]*Run{run(1), run(3)}); err != nil {
		t.Fatalf("two generators of one sale: %v", err)
	}
	for name, tc := range map[string]struct {
		change func(*Run)
		want   string
	}{
		"another voucher":     {func(r *Run) { r.Voucher.ID = "43" }, "not one sale"},
		"another begin_time":  {func(r *Run) { r.Voucher.Begin = r.Voucher.Begin.Add(time.Second) }, "not one sale"},
		"another bots' beat":  {func(r *Run) { r.Shape.BotEvery = time.Second }, "not one crowd"},
		"a user of the other": {func(r *Run) { r.Users[1].ID = "1" }, "user 1 is in runs 1 and 2"},
	} {
		b := run(3)
		tc.change(b)
		if _, err := merge([]*Run{run(1), b}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one saying %q", name, err, tc.want)
		}
	}
}
