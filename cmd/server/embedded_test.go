package main

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"seckill/internal/auth"
)

// TestEmbeddedDemo is what a newcomer with only Go does: start the server
// with nothing configured but the address, and buy a voucher. It needs no
// MySQL and no Redis, so it is never skipped.
func TestEmbeddedDemo(t *testing.T) {
	in := start(t, map[string]string{"HTTP_ADDR": freeAddr(t)})
	base := in.Base

	if !strings.Contains(in.log.String(), "EMBEDDED") {
		t.Errorf("embedded mode does not say so loudly in its log:\n%s", in.log.String())
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if r := mustCall(t, "GET", base+path, "", nil); r.Status != http.StatusOK {
			t.Errorf("%s: %d %s", path, r.Status, r.Raw)
		}
	}

	// 13800000000 is the demo's admin; dev codes are on by default.
	admin, _ := mustLogin(t, base, "13800000000")
	v := openVoucher(t, base, admin, 5)
	user, userID := mustLogin(t, base, "13912345678")

	r := mustCall(t, "POST", base+"/seckill/"+v, user, nil)
	if r.Status != http.StatusOK {
		t.Fatalf("seckill: %d %s", r.Status, r.Raw)
	}
	orderID := r.Str("order_id")
	if _, err := strconv.ParseInt(orderID, 10, 64); err != nil {
		t.Fatalf("order_id %q is not a string of digits: %s", orderID, r.Raw)
	}

	r = mustCall(t, "POST", base+"/seckill/"+v, user, nil)
	if r.Status != http.StatusConflict || r.Code() != "already_ordered" {
		t.Errorf("second seckill: %d %s, want 409 already_ordered", r.Status, r.Raw)
	}

	r = mustCall(t, "GET", base+"/orders/"+orderID, user, nil)
	if r.Status != http.StatusOK {
		t.Fatalf("GET order: %d %s", r.Status, r.Raw)
	}
	if r.Str("id") != orderID || r.Str("user_id") != userID || r.Str("voucher_id") != v || r.Str("status") != "unpaid" {
		t.Errorf("order: %s", r.Raw)
	}
	if _, err := time.Parse(time.RFC3339, r.Str("created_at")); err != nil {
		t.Errorf("created_at %q is not RFC 3339", r.Str("created_at"))
	}

	r = mustCall(t, "GET", base+"/vouchers/"+v, "", nil)
	if r.Status != http.StatusOK || r.Body["stock"] != 4.0 {
		t.Errorf("voucher after one order: %d %s, want stock 4", r.Status, r.Raw)
	}

	// The demo voucher seeded at start is on sale too.
	r = mustCall(t, "GET", base+"/vouchers/1", "", nil)
	if r.Status != http.StatusOK || r.Body["stock"] != 100.0 {
		t.Errorf("seeded demo voucher: %d %s", r.Status, r.Raw)
	}

	// A waiting room works on the demo's in-process Redis and SQLite too:
	// a join before begin_time, the draw at begin_time, admission, and a
	// press that only the admitted buyer's succeeds.
	begin := time.Now().Add(1500 * time.Millisecond).Truncate(time.Second).Add(time.Second)
	rv := createVoucher(t, base, admin, 1, begin, begin.Add(time.Hour), "room", map[string]any{"admit_per_second": 1})
	other, _ := mustLogin(t, base, "13912345679")
	for _, tok := range []string{user, other} {
		if r := mustCall(t, "POST", base+"/vouchers/"+rv+"/room", tok, nil); r.Status != http.StatusOK || r.Str("state") != "waiting" {
			t.Fatalf("join the demo's room: %d %s", r.Status, r.Raw)
		}
	}
	// The place as events: the first at once, then the admission as it
	// comes.
	ctx, cancel := context.WithTimeout(context.Background(), time.Until(begin)+5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/vouchers/"+rv+"/room/events", nil)
	req.Header.Set("Authorization", "Bearer "+user)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("room events: %v %v", err, resp)
	}
	var states []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() && !slices.Contains(states, "admitted") && !slices.Contains(states, "sold_out") {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			var p struct{ State string }
			json.Unmarshal([]byte(data), &p)
			states = append(states, p.State)
		}
	}
	resp.Body.Close()
	if len(states) < 2 || states[0] != "waiting" {
		t.Errorf("the room's events: %v, want waiting, then the turn", states)
	}
	time.Sleep(time.Until(begin) + 1500*time.Millisecond)
	won := 0
	for _, tok := range []string{user, other} {
		p := mustCall(t, "GET", base+"/vouchers/"+rv+"/room", tok, nil)
		r := mustCall(t, "POST", base+"/seckill/"+rv, tok, nil)
		switch {
		case p.Str("state") == "admitted" && r.Status == http.StatusOK:
			won++
		case p.Str("state") != "admitted" && r.Code() == "not_admitted":
		default:
			t.Errorf("place %s, then seckill %d %s", p.Raw, r.Status, r.Raw)
		}
	}
	if won != 1 {
		t.Errorf("%d buyers won the room's one unit, want 1", won)
	}

	// Logging out everywhere works on the demo's Redis too: the token is
	// refused within a Refresh.
	if r := mustCall(t, "POST", base+"/auth/logout", other, nil); r.Status != http.StatusOK {
		t.Errorf("logout on the demo: %d %s", r.Status, r.Raw)
	}
	time.Sleep(auth.Refresh + 100*time.Millisecond)
	if r := mustCall(t, "GET", base+"/vouchers/"+rv+"/room", other, nil); r.Status != http.StatusUnauthorized {
		t.Errorf("a token after its logout on the demo: %d %s", r.Status, r.Raw)
	}

	// Stopping is clean.
	if err := in.Stop(); err != nil {
		t.Errorf("stop: %v", err)
	}
}
