package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"seckill/internal/testenv"
)

// readPage is what the live page shows, read off its elements.
const readPage = `(() => {
  const t = (id) => (document.getElementById(id) || {}).textContent || "";
  return {
    status: t("status"), redis: t("redis-left"), mysql: t("mysql-left"), orders: t("orders"),
    initial: t("initial"), holds: document.getElementById("invariant").dataset.holds,
    ok: t("total-ok"), sold_out: t("total-sold_out"), already: t("total-already_ordered"),
    busy: t("total-busy"), p99: t("p99"), queue: t("queue"), crowd: t("crowd-message"),
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
// Then its button starts the simulated crowd on a second voucher, and the
// page shows that sale sell out too. A screenshot is saved.
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
	waitPage(t, browser, 5*time.Second, func(s shown) bool {
		return s["status"] == "live" && s["initial"] == strconv.Itoa(stock) && s["redis"] == strconv.Itoa(stock) && s["holds"] == "true"
	})

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
	waitPage(t, browser, 5*time.Second, func(s shown) bool { return s["status"] == "live" && s["initial"] == strconv.Itoa(crowdStock) })
	// The button, pressed as a user would: by a click event on it.
	press := `document.getElementById("users").value = "80"; document.getElementById("crowd").click(); true`
	if _, err := browse(browser, chromedp.Evaluate[bool](press)); err != nil {
		t.Fatal(err)
	}
	crowd := waitPage(t, browser, 20*time.Second, func(s shown) bool {
		return s["redis"] == "0" && s["mysql"] == "0" && s["orders"] == strconv.Itoa(crowdStock) && count(s["ok"]) == crowdStock
	})
	if crowd["holds"] != "true" || crowd["crowd"] != "a crowd of 80 users is buying, 1000 presses a second" {
		t.Errorf("after the crowd: %v", crowd)
	}
	s := waitRest(t, testenv.Open(t, st.DSN), testenv.Redis(t, 4), vid2, 5*time.Second)
	checkInvariants(t, s, crowdStock, nil)

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
