package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"seckill/internal/payment"
	"seckill/internal/testenv"
)

// A rolling upgrade, tested: three instances of the oldest version an
// upgrade is supported from sell one voucher from one MySQL database and
// one Redis database, and are replaced one by one with this version's
// while buyers buy, pay, cancel, ask for refunds and let orders expire.
// Then the same backwards: a rollback. Each version runs as processes
// built from its own source, the old one from git, this one from the
// working tree (serverBinary).

// oldestUpgradable is the oldest commit a rolling upgrade to this version
// (and a rollback from it) is supported from: the last landed release,
// which docs/upgrading.md names. The two move together.
const oldestUpgradable = "94b3afe"

// head names this version, the working tree's, in the test's figures.
const head = "HEAD"

// oldServerBinary builds cmd/server as it was at commit, from the git
// repository the test runs in, into a directory removed when t ends:
// once per test run, for all of t's subtests. A checkout without the
// commit (a shallow clone, a source archive) skips the test, or fails it
// when SECKILL_REQUIRE_INTEGRATION=1: CI runs on a full clone.
func oldServerBinary(t *testing.T, commit string) string {
	t.Helper()
	missing := func(why string) {
		t.Helper()
		msg := fmt.Sprintf("cannot build the server at %s, the oldest version a rolling upgrade is supported from: %s", commit, why)
		if testenv.Required() {
			t.Fatalf("%s; SECKILL_REQUIRE_INTEGRATION=1 needs a full git clone (git fetch --unshallow)", msg)
		}
		t.Skip(msg)
	}
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		missing("this is not a git checkout")
	}
	root := strings.TrimSpace(string(top))
	if exec.Command("git", "-C", root, "cat-file", "-e", commit+"^{commit}").Run() != nil {
		missing("the commit is not in the history of " + root + " (a shallow clone?)")
	}
	dir := t.TempDir()
	src, tarball, bin := filepath.Join(dir, "src"), filepath.Join(dir, "src.tar"), filepath.Join(dir, "server-"+commit)
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	// -trimpath: the build cache's entries do not name the temporary
	// directory, so the next run builds the old packages from the cache.
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "./cmd/server")
	build.Dir = src
	for _, c := range []*exec.Cmd{
		exec.Command("git", "-C", root, "archive", "-o", tarball, commit),
		exec.Command("tar", "-x", "-f", tarball, "-C", src),
		build,
	} {
		if out, err := c.CombinedOutput(); err != nil {
			t.Fatalf("build the server at %s: %s: %v\n%s", commit, strings.Join(c.Args, " "), err, out)
		}
	}
	return bin
}

// rollout is three instances behind the test's own balancer: each call
// goes to the next instance in rotation. An instance taken out of
// rotation gets SIGTERM only once every call sent to it is answered (a
// balancer's connection draining), so that no transport error is the
// switch's own: every call is answered, and the answer is judged.
type rollout struct {
	st    stack
	async bool              // SECKILL_MODE=async: the webhook's 503 for a pending order is the contract's
	extra []string          // the instances' environment besides st's
	bins  map[string]string // version -> its binary

	mu        sync.Mutex
	slots     []*slot
	next      int
	switching bool
	heard     []heard
}

// slot is one instance of the three.
type slot struct {
	p        *proc
	version  string
	out      bool // out of rotation, draining
	inflight int  // calls sent to it and not yet answered
}

// heard is one answer, or a transport error, and who gave it.
type heard struct {
	kind, version string
	switching     bool // given while instances were being replaced
	status        int
	code          string
	broke         string // how it broke the contract; empty if it did not
}

// start starts n instances of version, one after the other, each ready
// (/readyz) before the next starts.
func (r *rollout) start(t *testing.T, version string, n int) {
	t.Helper()
	for range n {
		p := spawnBinary(t, r.bins[version], r.st.env(freeAddr(t), r.extra...), "/readyz")
		r.slots = append(r.slots, &slot{p: p, version: version})
	}
}

// via sends call to the next instance in rotation and judges its answer
// as a call of kind ("seckill", "webhook", ...; see breach).
func (r *rollout) via(kind string, call func(base string) (reply, error)) (reply, error) {
	r.mu.Lock()
	var s *slot
	for s == nil || s.out {
		s = r.slots[r.next%len(r.slots)]
		r.next++
	}
	s.inflight++
	r.mu.Unlock()
	rep, err := call(s.p.Base)
	r.mu.Lock()
	s.inflight--
	r.heard = append(r.heard, heard{kind: kind, version: s.version, switching: r.switching,
		status: rep.Status, code: rep.Code(), broke: breach(kind, r.async, rep, err)})
	r.mu.Unlock()
	return rep, err
}

// replace takes instance i out of rotation, stops it with SIGTERM once
// its calls are answered, starts version's instead (on another port) and
// puts it in rotation once it is ready.
func (r *rollout) replace(t *testing.T, i int, version string) {
	t.Helper()
	r.mu.Lock()
	s := r.slots[i]
	s.out = true
	r.mu.Unlock()
	waitFor(t, 10*time.Second, "the calls to the instance leaving answered", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return s.inflight == 0
	})
	began := time.Now()
	if err := s.p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.p.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("instance %d (%s) did not exit within 30s of SIGTERM", i, s.version)
	}
	if s.p.err != nil {
		t.Errorf("instance %d (%s) exited after SIGTERM with %v, want status 0", i, s.version, s.p.err)
	}
	stopped := time.Now()
	p := spawnBinary(t, r.bins[version], r.st.env(freeAddr(t), r.extra...), "/readyz")
	r.mu.Lock()
	r.slots[i] = &slot{p: p, version: version}
	r.mu.Unlock()
	t.Logf("instance %d: %s stopped in %s, %s ready %s later", i, s.version,
		stopped.Sub(began).Round(time.Millisecond), version, time.Since(stopped).Round(time.Millisecond))
}

// fleetInstances is the hash in which instances from level 8 on announce
// themselves (package fleet; docs/upgrading.md names it).
const fleetInstances = "seckill:{fleet}:instances"

// announced checks what the rollout shows of itself once instance i was
// replaced: in Redis, an announcement for every instance of this version
// and none for the old one, which announces nothing (every instance of
// this version that stopped took its own back); and on /readyz of
// instance i, if it is of this version, its version and every instance
// of this version alive, itself included.
func (r *rollout) announced(t *testing.T, i int) {
	t.Helper()
	r.mu.Lock()
	heads, s := 0, r.slots[i]
	for _, s := range r.slots {
		if s.version == head {
			heads++
		}
	}
	r.mu.Unlock()
	if n := testenv.Redis(t, r.st.RedisDB).HLen(context.Background(), fleetInstances).Val(); n != int64(heads) {
		t.Errorf("%d instances announced in %s, want the %d of %s", n, fleetInstances, heads, head)
	}
	if s.version != head {
		return
	}
	ready := mustCall(t, "GET", s.p.Base+"/readyz", "", nil)
	listed, _ := ready.Body["instances"].([]any)
	for _, in := range listed {
		if v, _ := in.(map[string]any)["version"].(string); v != ready.Str("version") {
			t.Errorf("/readyz of a new instance lists version %q beside its own %q: %s", v, ready.Str("version"), ready.Raw)
		}
	}
	if ready.Str("version") == "" || len(listed) != heads {
		t.Errorf("/readyz of a new instance: %s, want its version and the %d instances of it", ready.Raw, heads)
	}
}

// breach says how an answer to a call of kind breaks docs/api.md, or ""
// if it does not. Nothing is allowed but what the contract lists for that
// call in the sale's situation: tokens valid, the voucher on sale, orders
// that exist, MySQL and Redis up, and one request at a time per buyer.
// So no 503 (nothing is down) but the webhook's for an order still
// pending, in async mode, with Retry-After; and no 429 busy (no buyer has
// two requests in progress, and no rate limit is reached).
func breach(kind string, async bool, r reply, err error) string {
	if err != nil {
		return "no answer: " + err.Error()
	}
	code := r.Code()
	if kind == "webhook" && async && r.Status == http.StatusServiceUnavailable && code == "unavailable" && r.Header.Get("Retry-After") != "" {
		return ""
	}
	status, refund := r.Str("status"), r.Body["refund"] == true
	var ok bool
	switch kind {
	case "seckill":
		ok = r.Status == http.StatusOK && r.Str("order_id") != "" ||
			r.Status == http.StatusConflict && (code == "sold_out" || code == "already_ordered")
	case "webhook":
		ok = r.Status == http.StatusOK && r.Str("order_id") != "" &&
			(status == "paid" || refund && (status == "cancelled" || status == "refunded"))
	case "cancel":
		// invalid_state: a pending order (async), with Retry-After.
		ok = r.Status == http.StatusOK && status == "cancelled" ||
			r.Status == http.StatusConflict && code == "invalid_state" && r.Header.Get("Retry-After") != ""
	case "refund":
		ok = r.Status == http.StatusOK && status == "refunded"
	case "order":
		ok = r.Status == http.StatusOK && map[string]bool{"pending": true, "unpaid": true, "paid": true, "cancelled": true, "refunded": true}[status]
	case "voucher":
		ok = r.Status == http.StatusOK && r.Str("id") != ""
	}
	if !ok {
		return fmt.Sprintf("%d %s", r.Status, r.Raw)
	}
	return ""
}

// sale is one voucher sold through a rollout, stretch after stretch.
type sale struct {
	r     *rollout
	vid   string
	price int64
	l     ledger         // every seckill answer
	lives sync.WaitGroup // the lives of the orders taken

	mu   sync.Mutex
	want map[string]fate // order ID -> what it must be at rest, by what its buyer did
	// The contract's answers other than the plain one, counted apart:
	// payments made at once and refused because the order was still
	// pending when its deadline passed (async), and buyers' cancels
	// answered with the deadline's cancel because it came first.
	lateWritten, cancelLate int
}

// fate is an order's status at rest, and its cancel_reason if cancelled.
type fate struct{ status, reason string }

func (f fate) String() string {
	if f.reason == "" {
		return f.status
	}
	return f.status + " (" + f.reason + ")"
}

// until sends a call through the rollout until it is answered otherwise
// than 503, 429, or 409 with Retry-After (a pending order), as a client
// that honours them does, for at most 20 s.
func (s *sale) until(kind string, call func(base string) (reply, error)) reply {
	deadline := time.Now().Add(20 * time.Second)
	for {
		rep, err := s.r.via(kind, call)
		again := rep.Status == http.StatusServiceUnavailable || rep.Status == http.StatusTooManyRequests ||
			rep.Status == http.StatusConflict && rep.Header.Get("Retry-After") != ""
		if err != nil || !again || time.Now().After(deadline) {
			return rep
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// buyer is one buyer's visit: a purchase and, when it succeeds, the
// order's life, which the buyer's number chooses.
func (s *sale) buyer(t *testing.T, i int, u user) {
	rep := s.until("seckill", func(base string) (reply, error) {
		rep, err := call("POST", base+"/seckill/"+s.vid, u.Token, nil)
		s.l.add(outcome{User: u.ID, Status: rep.Status, Code: rep.Code(), OrderID: rep.Str("order_id"), Err: err})
		return rep, err
	})
	if rep.Status == http.StatusOK {
		s.lives.Go(func() { s.life(t, i, u, rep.Str("order_id")) })
	}
}

// life is what buyer i does with order id: buyers 0 and 1 of every five
// pay at once (and 1 then asks for a refund), 2 cancels, 3 lets it expire,
// 4 lets it expire and pays late. It checks the answers it gets, and
// records what the order must be at rest.
func (s *sale) life(t *testing.T, i int, u user, id string) {
	oid, _ := strconv.ParseInt(id, 10, 64)
	// pay delivers the payment until it is answered otherwise than 503, and
	// says how many 503s came first and when the last answer came.
	pay := func() (r reply, pending int, at time.Time) {
		e := payment.Event{ID: fmt.Sprintf("evt_%d", oid), OrderID: oid, Amount: s.price}
		r = s.until("webhook", func(base string) (reply, error) {
			rep, err := webhook(base, e)
			if rep.Status == http.StatusServiceUnavailable {
				pending++
			}
			return rep, err
		})
		return r, pending, time.Now()
	}
	payBy := func(r reply) time.Time { at, _ := time.Parse(time.RFC3339Nano, r.Str("pay_by")); return at }
	want := fate{"cancelled", "timeout"}
	switch i % 5 {
	case 0, 1:
		r, pending, at := pay()
		deadline := payBy(s.order(u, id))
		switch {
		case r.Status == http.StatusOK && r.Str("status") == "paid" && r.Body["refund"] == nil:
			want = fate{"paid", ""}
		case s.r.async && r.Status == http.StatusOK && r.Str("status") == "cancelled" && r.Body["refund"] == true &&
			pending > 0 && !deadline.IsZero() && at.After(deadline):
			// The contract's case: answered 503 while pending, and the
			// deadline passed before the order was written and the event
			// could be applied. The order is cancelled by its deadline.
			s.mu.Lock()
			s.lateWritten++
			s.mu.Unlock()
		default:
			t.Errorf("order %d paid at once, %d answers 503 first, last answer %s before its deadline %s: %d %s, want paid (or, async, cancelled with refund once its deadline passed while it was pending)",
				oid, pending, deadline.Sub(at).Round(time.Millisecond), deadline.Format(time.RFC3339Nano), r.Status, r.Raw)
		}
		if want.status == "paid" && i%5 == 1 {
			s.until("refund", func(base string) (reply, error) { return call("POST", base+"/orders/"+id+"/refund", u.Token, nil) })
			want = fate{"refunded", ""}
		}
	case 2:
		r := s.until("cancel", func(base string) (reply, error) { return call("POST", base+"/orders/"+id+"/cancel", u.Token, nil) })
		at := time.Now()
		want = fate{"cancelled", "buyer"}
		switch {
		case r.Status == http.StatusOK && r.Str("status") == "cancelled" && r.Str("cancel_reason") == "buyer":
		case r.Status == http.StatusOK && r.Str("status") == "cancelled" && r.Str("cancel_reason") == "timeout" &&
			!payBy(r).IsZero() && at.After(payBy(r)):
			// Already cancelled by its deadline (async: written too late):
			// the contract's 200 with the order, nothing changed twice.
			want.reason = "timeout"
			s.mu.Lock()
			s.cancelLate++
			s.mu.Unlock()
		default:
			t.Errorf("order %d cancelled by its buyer: %d %s, want 200 cancelled with cancel_reason buyer (or timeout once its pay_by passed)", oid, r.Status, r.Raw)
		}
	case 4:
		// Its deadline, once it is written (async: pending until then).
		var deadline time.Time
		for until := time.Now().Add(20 * time.Second); deadline.IsZero() && time.Now().Before(until); time.Sleep(100 * time.Millisecond) {
			deadline = payBy(s.order(u, id))
		}
		time.Sleep(time.Until(deadline) + 1500*time.Millisecond)
		if r, _, _ := pay(); r.Status != http.StatusOK || r.Str("status") != "cancelled" || r.Body["refund"] != true {
			t.Errorf("order %d paid 1.5s after its deadline: %d %s, want cancelled and refunded", oid, r.Status, r.Raw)
		}
	}
	s.order(u, id)
	s.mu.Lock()
	s.want[id] = want
	s.mu.Unlock()
}

// order reads an order as its buyer does.
func (s *sale) order(u user, id string) reply {
	return s.until("order", func(base string) (reply, error) { return call("GET", base+"/orders/"+id, u.Token, nil) })
}

// stretch sells to users through the rollout (one new buyer every 40 ms,
// and a reader of the voucher every 50 ms) and meanwhile replaces its
// instances one by one with version to's, 1.5 s after it began, a second
// apart. It stops 1.5 s after the switch, or when the users run out if
// that comes later, and returns once every order's life is over.
func (s *sale) stretch(t *testing.T, users []user, to string) {
	t.Helper()
	stop := make(chan struct{})
	var traffic sync.WaitGroup
	traffic.Go(func() {
		tick := time.NewTicker(40 * time.Millisecond)
		defer tick.Stop()
		for i, u := range users {
			<-tick.C
			traffic.Go(func() { s.buyer(t, i, u) })
		}
	})
	traffic.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			s.r.via("voucher", func(base string) (reply, error) { return call("GET", base+"/vouchers/"+s.vid, "", nil) })
		}
	})
	time.Sleep(1500 * time.Millisecond)
	s.r.mu.Lock()
	s.r.switching = true
	s.r.mu.Unlock()
	// Each new instance sells beside the old ones for a second before the
	// next is replaced: every mix of the two versions sells.
	for i := range s.r.slots {
		if i > 0 {
			time.Sleep(time.Second)
		}
		s.r.replace(t, i, to)
		s.r.announced(t, i)
	}
	s.r.mu.Lock()
	s.r.switching = false
	s.r.mu.Unlock()
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	traffic.Wait()
	s.lives.Wait()
}

// figures logs the answers heard so far, and clears them: how many each
// version gave while the instances were replaced (and how many units each
// sold meanwhile), how many were 503s and 429s, and of which calls; and
// it fails the test on any answer that broke the contract, and unless
// each of versions sold a unit while the instances were replaced.
func (r *rollout) figures(t *testing.T, what string, versions ...string) {
	t.Helper()
	r.mu.Lock()
	heard := r.heard
	r.heard = nil
	r.mu.Unlock()
	during, sold, all := map[string]int{}, map[string]int{}, map[string]int{}
	refused := map[string]int{} // "503 webhook" -> answers
	var broke []string
	for _, h := range heard {
		all[h.version]++
		if h.switching {
			during[h.version]++
			if h.kind == "seckill" && h.status == http.StatusOK {
				sold[h.version]++
			}
		}
		if h.status == http.StatusServiceUnavailable || h.status == http.StatusTooManyRequests {
			refused[fmt.Sprintf("%d %s", h.status, h.kind)]++
		}
		if h.broke != "" {
			broke = append(broke, fmt.Sprintf("%s from %s: %s", h.kind, h.version, h.broke))
		}
	}
	t.Logf("%s: %d answers; during the switch %s (units sold: %s); in all %s; refused %s",
		what, len(heard), tally(during), tally(sold), tally(all), tally(refused))
	for _, b := range broke[:min(len(broke), 10)] {
		t.Errorf("an answer broke the contract: %s", b)
	}
	if len(broke) > 0 {
		t.Errorf("%d answers of %d broke the contract", len(broke), len(heard))
	}
	for _, v := range versions {
		if sold[v] == 0 {
			t.Errorf("%s: %s sold no unit while the instances were replaced (%d answers then)", what, v, during[v])
		}
	}
}

// tally prints counts by name, in the names' order.
func tally(m map[string]int) string {
	var out []string
	for k, n := range m {
		out = append(out, fmt.Sprintf("%s %d", k, n))
	}
	sort.Strings(out)
	if out == nil {
		return "none"
	}
	return strings.Join(out, ", ")
}

// atRest waits until the sale is at rest (every accepted order written,
// none unpaid, every returned unit back in Redis) and checks the
// lifecycle's invariants: stock + orders unpaid or paid = initial, one
// order per user, Redis equal to MySQL, the voucher's counts equal to its
// rows'; every 200 an order of its buyer's, in the status its buyer's
// doing gives it, never both paid and cancelled, and, read through the
// API, a cancelled one with the cancel_reason its buyer's doing gives it
// (buyer or timeout) and no other with one; and nothing dead-lettered.
// It returns the orders by status.
func (s *sale) atRest(t *testing.T, mode, admin string, initial int) map[string]int {
	t.Helper()
	db, rdb := testenv.Open(t, s.r.st.DSN), testenv.Redis(t, s.r.st.RedisDB)
	won := s.l.wins(t)
	if mode == "async" {
		waitWritten(t, db, rdb, s.vid, won, 20*time.Second)
	}
	waitFor(t, 20*time.Second, "no order unpaid", func() bool {
		var n int64
		db.Raw("SELECT COUNT(*) FROM voucher_orders WHERE voucher_id = ? AND status = 'unpaid'", s.vid).Scan(&n)
		return n == 0
	})
	st, _ := checkLifecycle(t, db, rdb, s.vid, initial)
	rows := lifecycleRows(t, db, s.vid)
	s.mu.Lock()
	defer s.mu.Unlock()
	for u, id := range won {
		oid, _ := strconv.ParseInt(id, 10, 64)
		row, ok := rows[oid]
		switch {
		case !ok:
			t.Errorf("user %s was answered 200 with order %s, and no such row exists", u, id)
		case strconv.FormatInt(st.Orders[id], 10) != u:
			t.Errorf("order %s belongs to user %d, and was answered to user %s", id, st.Orders[id], u)
		case row.paid && row.cancelled:
			t.Errorf("order %s was paid and cancelled", id)
		case row.status != s.want[id].status:
			t.Errorf("order %s is %s at rest, want %s", id, row.status, s.want[id])
		}
	}
	reasons := s.reasons(t, admin, won)
	for _, id := range won {
		if w := s.want[id]; reasons[id] != w.reason {
			t.Errorf("order %s at rest has cancel_reason %q, want %s", id, reasons[id], w)
		}
	}
	if len(rows) != len(won) {
		t.Errorf("%d orders, and %d answers of 200", len(rows), len(won))
	}
	r := mustCall(t, "GET", s.r.slots[0].p.Base+"/admin/dead-letters", admin, nil)
	if dead, _ := r.Body["dead_letters"].([]any); r.Status != http.StatusOK || len(dead) != 0 {
		t.Errorf("dead letters: %d %s, want none", r.Status, r.Raw)
	}
	byStatus := map[string]int{}
	for _, row := range rows {
		byStatus[row.status]++
	}
	return byStatus
}

// reasons reads the cancel_reason of the orders won as the admin does,
// from the instances in turn (around the rollout: these reads are not the
// switch's).
func (s *sale) reasons(t *testing.T, admin string, won map[string]string) map[string]string {
	t.Helper()
	out, k := map[string]string{}, 0
	for _, id := range won {
		base := s.r.slots[k%len(s.r.slots)].p.Base
		k++
		r := mustCall(t, "GET", base+"/orders/"+id, admin, nil)
		if r.Status != http.StatusOK {
			t.Errorf("GET /orders/%s as the admin: %d %s, want 200", id, r.Status, r.Raw)
		}
		if reason := r.Body["cancel_reason"]; reason != nil {
			out[id] = fmt.Sprint(reason)
		}
	}
	return out
}

// Three instances of the oldest supported version (oldestUpgradable) sell
// a voucher in each mode, one MySQL database and one Redis database for
// all; while they sell, they are replaced one by one with this version's
// (SIGTERM, then the new instance, ready, in rotation), and then back
// again, a rollback, while the sale goes on. As each instance is
// replaced, the announcements of this version's (package fleet) count
// them in Redis and on /readyz. Each version sells at least a unit while
// the instances are replaced; every payment made at once is kept (async:
// unless the order was still pending when its deadline passed), every
// buyer's cancel answered 200 cancelled (buyer; timeout only once its
// deadline passed). After each switch, at rest: the lifecycle's
// invariants, each order's status and cancel_reason, nothing
// dead-lettered, and no answer of either version that broke the contract,
// no 503 but async's webhook for a pending order and no 429. The figures
// of each switch (the answers of each version while it lasted, the 503s)
// are logged for the release note.
func TestRollingUpgrade(t *testing.T) {
	testenv.Integration(t, "the server, built at two versions")
	bins := map[string]string{oldestUpgradable: oldServerBinary(t, oldestUpgradable), head: serverBinary(t)}
	for _, mode := range []struct {
		name    string
		redisDB int
	}{{"sync", 2}, {"async", 8}} { // flushed: no test of another package may use them (testenv.Redis)
		t.Run(mode.name, func(t *testing.T) {
			began := time.Now()
			// The old version makes the database from nothing, as it did in
			// production; the new one migrates it as it starts.
			st := stack{DSN: testenv.EmptyMySQLDSN(t), RedisDB: mode.redisDB}
			if err := testenv.Redis(t, st.RedisDB).FlushDB(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
			r := &rollout{st: st, bins: bins, async: mode.name == "async", extra: []string{"SECKILL_MODE", mode.name}}
			r.start(t, oldestUpgradable, 3)
			base := r.slots[0].p.Base
			admin, _ := mustLogin(t, base, adminPhone)
			const initial, price, payWithin = 100, 990, 5
			s := &sale{r: r, price: price, want: map[string]fate{},
				vid: createVoucher(t, base, admin, initial, time.Now().Add(-time.Minute), time.Now().Add(time.Hour),
					"price", price, "pay_within", payWithin)}
			for _, step := range []struct{ name, to string }{
				{"upgrade", head},
				{"rollback", oldestUpgradable},
			} {
				from, stepBegan := r.slots[0].version, time.Now()
				// Its buyers log in on the instances it begins with.
				buyers := loginMany(t, r.slots[0].p.Base, 250)
				s.stretch(t, buyers, step.to)
				r.figures(t, fmt.Sprintf("%s from %s to %s", step.name, from, step.to), from, step.to)
				byStatus := s.atRest(t, mode.name, admin, initial)
				s.mu.Lock()
				t.Logf("%s at rest %s after it began: orders %s; payments made at once refused as the order was pending past its deadline: %d; buyers' cancels answered as cancelled by the deadline: %d",
					step.name, time.Since(stepBegan).Round(time.Second), tally(byStatus), s.lateWritten, s.cancelLate)
				s.lateWritten, s.cancelLate = 0, 0
				s.mu.Unlock()
				if t.Failed() {
					return
				}
			}
			t.Logf("%s: %s in all", mode.name, time.Since(began).Round(time.Second))
		})
	}
}
