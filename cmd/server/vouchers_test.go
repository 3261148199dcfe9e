package main

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"seckill/internal/stock"
	"seckill/internal/testenv"
)

// TestListVouchers drives GET /vouchers on a real server (MySQL, Redis):
// newest first, pages that follow each other by next_before without a gap
// or a repeat, the stock as GET /vouchers/{id} reads it (after a sale,
// split over buckets, and from MySQL while Redis has lost the keys), and
// 400 for every malformed parameter.
func TestListVouchers(t *testing.T) {
	st := newStack(t, 0)
	in := start(t, st.env(freeAddr(t)))
	admin, _ := mustLogin(t, in.Base, adminPhone)
	buyer, _ := mustLogin(t, in.Base, "13900000071")

	var ids []string // oldest first
	for i := range 5 {
		ids = append(ids, createVoucher(t, in.Base, admin, 10+i, time.Now().Add(-time.Minute), time.Now().Add(time.Hour)))
	}
	split := createVoucher(t, in.Base, admin, 7, time.Now().Add(-time.Minute), time.Now().Add(time.Hour), "buckets", 3)
	ids = append(ids, split)
	if r := mustCall(t, "POST", in.Base+"/seckill/"+ids[1], buyer, nil); r.Status != http.StatusOK {
		t.Fatalf("seckill: %d %s", r.Status, r.Raw)
	}
	lost, _ := strconv.ParseInt(ids[2], 10, 64)
	if err := testenv.Redis(t, 0).Del(context.Background(), stock.KeysOf(lost).Stock).Err(); err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{ids[0]: 10, ids[1]: 10, ids[2]: 12, ids[3]: 13, ids[4]: 14, split: 7}

	// Pages of two, from the newest: this test's six vouchers come first
	// (a fresh database), and every one matches GET /vouchers/{id}.
	var seen []string
	next := ""
	for page := 0; page < 3; page++ {
		url := in.Base + "/vouchers?limit=2"
		if next != "" {
			url += "&before=" + next
		}
		r := mustCall(t, "GET", url, "", nil)
		if r.Status != http.StatusOK {
			t.Fatalf("GET %s: %d %s", url, r.Status, r.Raw)
		}
		list, _ := r.Body["vouchers"].([]any)
		if len(list) != 2 {
			t.Fatalf("GET %s: %d vouchers, want 2: %s", url, len(list), r.Raw)
		}
		for _, e := range list {
			v := e.(map[string]any)
			id := v["id"].(string)
			seen = append(seen, id)
			one := mustCall(t, "GET", in.Base+"/vouchers/"+id, "", nil)
			for _, k := range []string{"title", "stock", "begin_time", "end_time", "buckets", "price", "pay_within"} {
				if v[k] != one.Body[k] {
					t.Errorf("voucher %s: listed %s %v, GET /vouchers/%s says %v", id, k, v[k], id, one.Body[k])
				}
			}
			if v["stock"] != want[id] {
				t.Errorf("voucher %s: stock %v, want %v", id, v["stock"], want[id])
			}
		}
		// The third page ends with the oldest voucher: the last page.
		next = r.Str("next_before")
		if wantNext := seen[len(seen)-1]; page == 2 && r.Body["next_before"] != nil || page < 2 && next != wantNext {
			t.Errorf("page %d: next_before %v, want the last ID listed (%s), null on the last page", page, r.Body["next_before"], wantNext)
		}
	}
	for i, id := range seen {
		if id != ids[len(ids)-1-i] {
			t.Fatalf("listed %v, want %v newest first", seen, ids)
		}
	}
	r := mustCall(t, "GET", in.Base+"/vouchers?before="+ids[0], "", nil)
	if list, _ := r.Body["vouchers"].([]any); r.Status != http.StatusOK || len(list) != 0 || r.Body["next_before"] != nil {
		t.Errorf("the page past the oldest: %d %s, want 200 with none and next_before null", r.Status, r.Raw)
	}
	r = mustCall(t, "GET", in.Base+"/vouchers", "", nil)
	if list, _ := r.Body["vouchers"].([]any); r.Status != http.StatusOK || len(list) != len(ids) || r.Body["next_before"] != nil {
		t.Errorf("GET /vouchers (default limit 20): %d %s, want all %d and next_before null", r.Status, r.Raw, len(ids))
	}

	for _, q := range []string{"limit=0", "limit=101", "limit=-1", "limit=+5", "limit=", "limit=abc", "limit=1&limit=2",
		"before=0", "before=-3", "before=9223372036854775808", "before=", "before=%205", "before=1e3", "before=1&before=2"} {
		r := mustCall(t, "GET", in.Base+"/vouchers?"+q, "", nil)
		if r.Status != http.StatusBadRequest || r.Code() != "invalid_argument" {
			t.Errorf("GET /vouchers?%s: %d %s, want 400 invalid_argument", q, r.Status, r.Raw)
		}
	}
	for _, q := range []string{"limit=100", "limit=1", "before=9223372036854775807", "unknown=1"} {
		if r := mustCall(t, "GET", in.Base+"/vouchers?"+q, "", nil); r.Status != http.StatusOK {
			t.Errorf("GET /vouchers?%s: %d %s, want 200", q, r.Status, r.Raw)
		}
	}
}
