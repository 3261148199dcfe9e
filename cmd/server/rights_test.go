package main

import (
	"net/http"
	"testing"
	"time"

	"seckill/internal/auth"
)

// Rights that end (issue 35, probe finding L1), on real servers sharing
// MySQL and Redis.

// An admin token is an admin's only on the instances where its phone is
// in ADMIN_PHONES: started without it, an instance refuses the token on
// the admin routes and takes it for a plain user's where an admin may do
// more (another buyer's order). Before issue 35 the role baked into the
// token at login held until it expired.
func TestAPIAdminRoleEnds(t *testing.T) {
	st := newStack(t, 0)
	was := start(t, st.env(freeAddr(t)))                                // ADMIN_PHONES=adminPhone
	now := start(t, st.env(freeAddr(t), "ADMIN_PHONES", "13900000099")) // the phone left the list
	admin, _ := mustLogin(t, was.Base, adminPhone)
	buyer, _ := mustLogin(t, was.Base, "13900000098")
	vid := openVoucher(t, was.Base, admin, 1)
	o := mustCall(t, "POST", was.Base+"/seckill/"+vid, buyer, nil)
	if o.Status != http.StatusOK {
		t.Fatalf("buy: %d %s", o.Status, o.Raw)
	}
	order := "/orders/" + o.Str("order_id")

	for _, tt := range []struct {
		name         string
		in           *instance
		method, path string
		body         any
		status       int
	}{
		{"queue, while an admin", was, "GET", "/admin/queue", nil, http.StatusOK},
		{"queue, after", now, "GET", "/admin/queue", nil, http.StatusForbidden},
		{"dead letters, after", now, "GET", "/admin/dead-letters", nil, http.StatusForbidden},
		{"a voucher, after", now, "POST", "/vouchers", map[string]any{"title": "x", "stock": 1,
			"begin_time": time.Now().UTC().Format(time.RFC3339), "end_time": time.Now().Add(time.Hour).UTC().Format(time.RFC3339)}, http.StatusForbidden},
		{"metrics, after", now, "GET", "/metrics", nil, http.StatusForbidden},
		{"another's order, while an admin", was, "GET", order, nil, http.StatusOK},
		{"another's order, after", now, "GET", order, nil, http.StatusNotFound},
		{"refund another's order, after", now, "POST", order + "/refund", nil, http.StatusNotFound},
	} {
		// call, not mustCall: an admin's 200 of /metrics is not JSON.
		if r, _ := call(tt.method, tt.in.Base+tt.path, admin, tt.body); r.Status != tt.status {
			t.Errorf("%s: %s %s = %d %s, want %d", tt.name, tt.method, tt.path, r.Status, r.Raw, tt.status)
		}
	}
	// The buyer still sees their own order there.
	if r := mustCall(t, "GET", now.Base+order, buyer, nil); r.Status != http.StatusOK {
		t.Errorf("the buyer's own order: %d %s", r.Status, r.Raw)
	}
}

// POST /auth/logout ends every session of its caller: the token it was
// sent with, and any other issued before it, is refused on every
// instance within auth.Refresh; a login afterwards works at once, on
// every instance.
func TestAPILogoutEverywhere(t *testing.T) {
	// A Redis database of its own: a logout is kept in Redis by user ID
	// for a day, and the other tests' databases number their users from
	// 1 too, so in the shared database 0 it would void their users'
	// tokens.
	st := newStack(t, 3)
	a, b := start(t, st.env(freeAddr(t))), start(t, st.env(freeAddr(t)))
	const phone = "13900000097"
	first, _ := mustLogin(t, a.Base, phone)
	second, _ := mustLogin(t, b.Base, phone) // another device
	other, _ := mustLogin(t, a.Base, "13900000096")
	// An order nobody has: a good token is answered 404, a void one 401.
	const probe = "/orders/1"
	accepted := func(in *instance, token string) bool {
		t.Helper()
		r := mustCall(t, "GET", in.Base+probe, token, nil)
		if r.Status != http.StatusNotFound && r.Status != http.StatusUnauthorized {
			t.Fatalf("GET %s: %d %s", probe, r.Status, r.Raw)
		}
		return r.Status == http.StatusNotFound
	}
	for _, in := range []*instance{a, b} { // each instance verifies, and remembers, both
		for _, tok := range []string{first, second} {
			if !accepted(in, tok) {
				t.Fatal("a fresh token refused")
			}
		}
	}

	r := mustCall(t, "POST", a.Base+"/auth/logout", first, nil)
	if r.Status != http.StatusOK || r.Body["logged_out"] != true {
		t.Fatalf("POST /auth/logout: %d %s", r.Status, r.Raw)
	}
	loggedOut := time.Now()
	again, _ := mustLogin(t, b.Base, phone)
	for _, in := range []*instance{a, b} {
		if !accepted(in, again) {
			t.Error("a login right after the logout: its token refused")
		}
	}
	// Every old token, on every instance, within Refresh (and a second
	// for the test's own requests).
	waitFor(t, auth.Refresh+time.Second, "the old tokens refused on every instance", func() bool {
		for _, in := range []*instance{a, b} {
			for _, tok := range []string{first, second} {
				if accepted(in, tok) {
					return false
				}
			}
		}
		return true
	})
	t.Logf("old tokens refused everywhere %s after the logout", time.Since(loggedOut).Round(time.Millisecond))
	for _, in := range []*instance{a, b} {
		if !accepted(in, again) || !accepted(in, other) {
			t.Error("the new token, or another user's, refused after the logout")
		}
	}
	if r := mustCall(t, "POST", b.Base+"/auth/logout", "", nil); r.Status != http.StatusUnauthorized {
		t.Errorf("POST /auth/logout without a token: %d %s", r.Status, r.Raw)
	}
}
