package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"seckill/internal/testenv"
)

// readPage is what the live page shows, read off its elements.
//
// An element may be missing: read while the picker opens another page, the
// document is the new one's, not yet parsed.
const readPage = `(() => {
  const e = (id) => document.getElementById(id) || { textContent: "", dataset: {}, value: "", options: [] };
  const t = (id) => e(id).textContent || "";
  return {
    status: t("status"), redis: t("redis-left"), mysql: t("mysql-left"), orders: t("orders"),
    initial: t("initial"), holds: e("invariant").dataset.holds || "",
    ok: t("total-ok"), sold_out: t("total-sold_out"), already: t("total-already_ordered"),
    busy: t("total-busy"), p99: t("p99"), queue: t("queue"), crowd: t("crowd-message"),
    chart: t("chart-label"), chart_px: document.getElementById("chart-label") ? getComputedStyle(e("chart-label")).fontSize : "",
    note: t("answers-note"), picked: e("picker").value,
    picker: [...e("picker").options].map((o) => o.value).join(" "),
    path: location.pathname + location.hash,
  };
})()`

type shown map[string]string

// waitPage reads the page until want holds of what it shows, and returns
// the last reading.
func waitPage(t *testing.T, ctx context.Context, within time.Duration, want func(shown) bool) shown {
	t.Helper()
	deadline := time.Now().Add(within)
	var last shown
	for {
		got, err := browse(ctx, chromedp.Evaluate[map[string]string](readPage))
		if err != nil {
			t.Fatalf("read the page: %v", err)
		}
		last = got
		if want(last) {
			return last
		}
		if time.Now().After(deadline) {
			t.Fatalf("the page did not reach the state wanted within %s; it shows %v", within, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// browse runs one action on the browser, bounded: a page that never
// answers fails the test instead of hanging it.
func browse[T any](ctx context.Context, a chromedp.Action[T]) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return chromedp.Run(ctx, a)
}

func count(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}

// The live page, in a real browser, follows a sale to its end: the units
// left in Redis and MySQL reach 0, the orders the stock, the invariant
// stays green, and the answers it counts are the answers the buyers got.
// Its chart's caption is read at the page's size, and names no peak before
// a sale; a note says how far the answers trail the stock. Then its button
// starts the simulated crowd on a second voucher, with a token pasted as
// "Bearer ...", and the page shows that sale sell out too; a second crowd
// is new users. Its picker lists both vouchers and opens the one chosen.
// A screenshot is saved.
func TestLivePage(t *testing.T) {
	browser := testenv.Browser(t)
	st := newStack(t, 4)
	in := start(t, st.env(freeAddr(t), "LIVE_CROWD", "true"))
	admin, _ := mustLogin(t, in.Base, adminPhone)
	const stock = 40
	vid := openVoucher(t, in.Base, admin, stock)

	if _, err := browse(browser, chromedp.Navigate(in.Base+"/live/"+vid+"#token="+admin)); err != nil {
		t.Fatal(err)
	}
	before := waitPage(t, browser, 5*time.Second, func(s shown) bool {
		return s["status"] == "live" && s["initial"] == strconv.Itoa(stock) && s["redis"] == strconv.Itoa(stock) && s["holds"] == "true"
	})
	if before["chart"] != "bought per second, of the last 60 s this page watched: nothing sold" {
		t.Errorf("chart caption before any sale: %q, want no peak", before["chart"])
	}
	if px, err := strconv.ParseFloat(strings.TrimSuffix(before["chart_px"], "px"), 64); err != nil || px < 12 {
		t.Errorf("chart caption's font size %q, want 12px or more", before["chart_px"])
	}
	if !strings.HasPrefix(before["note"], "Answers up to ") || !strings.Contains(before["note"], "once a second") {
		t.Errorf("the answers' note: %q, want the second they stop at, and why", before["note"])
	}

	users := loginMany(t, in.Base, 100)
	var l ledger
	rush(&l, []*instance{in}, users, vid, 2)
	onlyExpected(t, &l, "sold_out", "already_ordered", "busy")
	won := l.wins(t)
	if len(won) != stock {
		t.Fatalf("%d users won, want %d", len(won), stock)
	}
	answers := map[string]int{}
	for _, o := range l.all {
		code := o.Code
		if o.Status == 200 {
			code = "ok"
		}
		answers[code]++
	}
	final := waitPage(t, browser, 10*time.Second, func(s shown) bool {
		return s["redis"] == "0" && s["mysql"] == "0" && s["orders"] == strconv.Itoa(stock) &&
			count(s["ok"]) == answers["ok"] && count(s["sold_out"]) == answers["sold_out"] &&
			count(s["already"]) == answers["already_ordered"] && count(s["busy"]) == answers["busy"]
	})
	if final["holds"] != "true" {
		t.Errorf("the invariant is not shown to hold: %v", final)
	}
	if final["queue"] != "none" {
		t.Errorf("queue in sync mode: %q, want none", final["queue"])
	}
	waitPage(t, browser, 5*time.Second, func(s shown) bool {
		return strings.HasPrefix(s["chart"], "bought per second, of the last 60 s this page watched: peak ")
	})
	shot, err := browse(browser, chromedp.FullScreenshot(90))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "live.jpg")
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot of the page at the end of the sale: %s (%d bytes); answers %v", path, len(shot), answers)

	// The crowd button, on a second voucher.
	const crowdStock = 30
	vid2 := openVoucher(t, in.Base, admin, crowdStock)
	if _, err := browse(browser, chromedp.Navigate(in.Base+"/live/"+vid2+"#token="+admin)); err != nil {
		t.Fatal(err)
	}
	waitPage(t, browser, 5*time.Second, func(s shown) bool {
		return s["status"] == "live" && s["initial"] == strconv.Itoa(crowdStock) && s["picked"] == vid2 && s["picker"] == vid2+" "+vid
	})
	// The button, pressed as a user would: by a click event on it, with
	// the token pasted as an Authorization header's value.
	press := `document.getElementById("token").value = " Bearer ` + admin + `"; document.getElementById("users").value = "80"; document.getElementById("crowd").click(); true`
	if _, err := browse(browser, chromedp.Evaluate[bool](press)); err != nil {
		t.Fatal(err)
	}
	crowd := waitPage(t, browser, 20*time.Second, func(s shown) bool {
		return s["redis"] == "0" && s["mysql"] == "0" && s["orders"] == strconv.Itoa(crowdStock) && count(s["ok"]) == crowdStock
	})
	if crowd["holds"] != "true" || crowd["crowd"] != "a crowd of 80 new users (phones 10000000000 to 10000000079) is buying, 1000 presses a second" {
		t.Errorf("after the crowd: %v", crowd)
	}
	// A second crowd is 80 other users: pressed until the first is done
	// (meanwhile it is refused, and the page says why).
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := browse(browser, chromedp.Evaluate[bool](`document.getElementById("crowd").click(); true`)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
		s := waitPage(t, browser, 5*time.Second, func(s shown) bool { return s["crowd"] != "starting…" })
		if s["crowd"] == "a crowd of 80 new users (phones 10000000080 to 10000000159) is buying, 1000 presses a second" {
			break
		}
		if !strings.HasPrefix(s["crowd"], "429: a crowd is already buying this voucher") || time.Now().After(deadline) {
			t.Fatalf("the second crowd: %q", s["crowd"])
		}
	}
	db := testenv.Open(t, st.DSN)
	s := waitRest(t, db, testenv.Redis(t, 4), vid2, 5*time.Second)
	checkInvariants(t, s, crowdStock, nil)
	// The crowd's users have phones no one can have (100 and then eight
	// digits), never a carrier's: on a real server the crowd would sign
	// real people up and spend their one order.
	// The two crowds are 160 users.
	var crowdUsers, others int64
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		db.Raw("SELECT COUNT(*) FROM users WHERE phone LIKE '100%'").Row().Scan(&crowdUsers)
		if crowdUsers >= 160 || time.Now().After(deadline) {
			break
		}
	}
	db.Raw("SELECT COUNT(*) FROM users WHERE phone NOT LIKE '100%' AND phone <> ?", adminPhone).Row().Scan(&others)
	if crowdUsers != 160 || others != int64(len(users)) {
		t.Errorf("users: %d with phones 100..., %d others; want the two crowds' 160 and the test's %d", crowdUsers, others, len(users))
	}

	// The picker opens the first voucher's page, the token kept.
	choose := `const p = document.getElementById("picker"); p.value = "` + vid + `"; p.dispatchEvent(new Event("change")); true`
	if _, err := browse(browser, chromedp.Evaluate[bool](choose)); err != nil {
		t.Fatal(err)
	}
	// Until the new page is loaded, a reading may fail (the old page's
	// context is gone): read again.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		s, err := browse(browser, chromedp.Evaluate[map[string]string](readPage))
		if err == nil && s["path"] == "/live/"+vid+"#token="+admin && s["status"] == "live" && s["initial"] == strconv.Itoa(stock) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the picker did not open voucher %s's page within 5s: %v (%v)", vid, s, err)
		}
	}

	// Without LIVE_CROWD, or without an admin token, the button is refused.
	other := start(t, st.env(freeAddr(t)))
	if r := mustCall(t, "POST", other.Base+"/live/"+vid2+"/crowd", admin, nil); r.Status != 403 {
		t.Errorf("crowd without LIVE_CROWD: %d %s, want 403", r.Status, r.Raw)
	}
	if r := mustCall(t, "POST", in.Base+"/live/"+vid2+"/crowd", users[0].Token, nil); r.Status != 403 {
		t.Errorf("crowd by a user: %d %s, want 403", r.Status, r.Raw)
	}
	if r := mustCall(t, "GET", in.Base+"/live/"+fmt.Sprint(1<<62), "", nil); r.Status != 404 {
		t.Errorf("page of no voucher: %d, want 404", r.Status)
	}
}

// holdRequest sends a request that stays in flight, keeping a shutdown
// waiting: its headers whole, its body not (the server waits for the
// rest, up to HTTP_BODY_TIMEOUT). It holds no slot of MAX_IN_FLIGHT: a
// request takes one only once its body is in (see holdSlot). It returns
// once the server reads the body: its 100 Continue says so. release ends
// it.
func holdRequest(t *testing.T, base string) (release func()) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	req := "POST /auth/login HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: 100\r\nExpect: 100-continue\r\n\r\n"
	if _, err := conn.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "HTTP/1.1 100 ") {
		t.Fatalf("the held request: %q (%v), want 100 Continue from its handler", line, err)
	}
	if _, err := conn.Write([]byte("{")); err != nil {
		t.Fatal(err)
	}
	return func() { conn.Close() }
}

// holdSlot holds one of the instance's MAX_IN_FLIGHT slots: a buy (sync
// mode) of a voucher of its own whose row is locked, so that the request,
// its body read, waits in its handler until release, or its write deadline
// (STOCK_HOLD/3). It returns once /readyz (outside the cap) counts the
// request in flight.
func holdSlot(t *testing.T, st stack, base, admin string) (release func()) {
	t.Helper()
	vid := openVoucher(t, base, admin, 5)
	buyer, _ := mustLogin(t, base, fmt.Sprintf("137%08d", testenv.ID()%100_000_000))
	unlock := holdVoucherRow(t, st.DSN, vid)
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Refused while another request of the test held the slot: again.
		for try := 0; try < 100; try++ {
			if r, err := call("POST", base+"/seckill/"+vid, buyer, nil); err != nil || r.Status != http.StatusTooManyRequests {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		r, err := call("GET", base+"/readyz", "", nil)
		if err == nil && r.Body["in_flight"] == 1.0 {
			break
		}
		if time.Now().After(deadline) {
			unlock()
			t.Fatalf("the held buy is not in flight: /readyz %s (%v)", r.Raw, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return func() { unlock(); <-done }
}

// The event streams pass the cap on requests in flight (a stream lasts as
// long as its page); the live page and the crowd's POST do not: with the
// one slot of MAX_IN_FLIGHT=1 taken, a stream opens, and they are
// refused 429 busy.
func TestLiveStreamsAloneOutsideTheCap(t *testing.T) {
	st := newStack(t, 0)
	in := start(t, st.env(freeAddr(t), "LIVE_CROWD", "true", "MAX_IN_FLIGHT", "1"))
	admin, _ := mustLogin(t, in.Base, adminPhone)
	vid := openVoucher(t, in.Base, admin, 5)

	release := holdSlot(t, st, in.Base, admin)
	deadline := time.Now().Add(5 * time.Second)
	for {
		r, _ := call("GET", in.Base+"/vouchers/"+vid, "", nil)
		if r.Status == http.StatusTooManyRequests {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the held request did not take the slot: GET /vouchers answers %d", r.Status)
		}
		time.Sleep(20 * time.Millisecond)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", in.Base+"/live/"+vid+"/events", nil)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	line, _ := bufio.NewReader(resp.Body).ReadString('\n')
	if resp.StatusCode != http.StatusOK || line != "retry: 1000\n" {
		t.Errorf("the event stream at the cap: %d, first line %q; want 200 and its stream", resp.StatusCode, line)
	}
	for _, c := range []struct{ method, path, token string }{
		{"POST", "/live/" + vid + "/crowd", admin},
		{"GET", "/live/" + vid, ""},
	} {
		r, err := call(c.method, in.Base+c.path, c.token, map[string]int{"users": 1})
		if err != nil || r.Status != http.StatusTooManyRequests || r.Code() != "busy" || r.Header.Get("Retry-After") == "" {
			t.Errorf("%s %s at the cap: %d %.100q (%v), want 429 busy with Retry-After", c.method, c.path, r.Status, r.Raw, err)
		}
	}
	release()
	cancel()
}

// At shutdown the crowd stops first, before the drain of the requests in
// flight: its presses go to the router directly, so the drain would
// neither refuse nor wait for them, and a crowd still running would go on
// buying through it. A request held in flight keeps the drain going while
// the test counts the orders.
func TestLiveCrowdStopsBeforeTheDrain(t *testing.T) {
	st := newStack(t, 0)
	in := start(t, st.env(freeAddr(t), "LIVE_CROWD", "true", "HTTP_BODY_TIMEOUT", "10s"))
	admin, _ := mustLogin(t, in.Base, adminPhone)
	vid := openVoucher(t, in.Base, admin, 1000)
	db := testenv.Open(t, st.DSN)
	orders := func() int64 {
		var n int64
		if err := db.Raw("SELECT COUNT(*) FROM voucher_orders WHERE voucher_id = ?", vid).Row().Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// 300 users at 20 presses a second: buying for 15 seconds.
	if r := mustCall(t, "POST", in.Base+"/live/"+vid+"/crowd", admin, map[string]int{"users": 300, "rate": 20}); r.Status != http.StatusAccepted {
		t.Fatalf("start the crowd: %d %s", r.Status, r.Raw)
	}
	deadline := time.Now().Add(30 * time.Second)
	for orders() < 5 {
		if time.Now().After(deadline) {
			t.Fatalf("the crowd bought %d in 30s", orders())
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Every wait below counts from here: all of it must fit in the held
	// request's 10s (HTTP_BODY_TIMEOUT), or the drain ends on its own.
	release := holdRequest(t, in.Base)
	held := time.Now()
	in.stop()
	deadline = held.Add(2 * time.Second)
	for !strings.Contains(in.log.String(), "shutting down") {
		if time.Now().After(deadline) {
			t.Fatal("the instance did not begin to shut down")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The crowd's last presses answered and their writes landed (a write
	// may take up to its deadline, STOCK_HOLD/3 = 5s): the count holds
	// still for 1s. A crowd still buying (20 a second) never lets it; the
	// bound, 7s after the hold, leaves the 2s check below inside its 10s.
	before, still := orders(), time.Now()
	deadline = held.Add(7 * time.Second)
	for time.Since(still) < time.Second {
		if time.Now().After(deadline) {
			t.Fatalf("the crowd bought on during the drain: orders still counting up (%d) 7s after the hold", before)
		}
		time.Sleep(100 * time.Millisecond)
		if n := orders(); n != before {
			before, still = n, time.Now()
		}
	}
	time.Sleep(2 * time.Second) // 40 presses, were the crowd still on
	if after := orders(); after != before {
		t.Errorf("the crowd bought %d more during the drain", after-before)
	}
	if strings.Contains(in.log.String(), "msg=stopped") {
		t.Fatal("the shutdown did not wait for the request in flight: the test proves nothing")
	}
	release()
}
