package auth

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"seckill/internal/testenv"
)

// An admin token is an admin's only where its user's phone is in
// ADMIN_PHONES now: on an instance started without the phone, the token
// is refused on the admin routes at once and counts as a plain user's
// where an admin may do more. An instance that knew the phone as an
// admin's notices an edit of the users table within adminFor.
func TestAdminRoleEnds(t *testing.T) {
	db := testenv.Open(t, testenv.MySQLDSN(t))
	rdb := testenv.Redis(t, 0)
	clock := &testClock{t: time.Now().Truncate(time.Second)}
	probe := newAuthInstance(db, rdb, clock)
	phone, plain := testPhone(t, probe.svc), testPhone(t, probe.svc)
	before := newAuthInstance(db, rdb, clock, phone)        // ADMIN_PHONES with the phone
	after := newAuthInstance(db, rdb, clock, "13999999999") // restarted without it
	nobody := newAuthInstance(db, rdb, clock)               // with no admin at all
	admin, id := before.logIn(t, phone)
	user, _ := before.logIn(t, plain)

	tests := []struct {
		name   string
		in     *authInstance
		path   string
		token  string
		status int
		role   string // the answer of /me
	}{
		{"admin while an admin", before, "/admin", admin, http.StatusOK, "admin"},
		{"admin's role while an admin", before, "/me", admin, http.StatusOK, "admin"},
		{"admin after leaving the list", after, "/admin", admin, http.StatusForbidden, ""},
		{"admin's role after leaving the list", after, "/me", admin, http.StatusOK, "user"},
		{"admin where nobody is", nobody, "/admin", admin, http.StatusForbidden, ""},
		{"admin's role where nobody is", nobody, "/me", admin, http.StatusOK, "user"},
		{"user on an admin route", before, "/admin", user, http.StatusForbidden, ""},
		{"user's role", before, "/me", user, http.StatusOK, "user"},
		{"nobody on an admin route", before, "/admin", "", http.StatusUnauthorized, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, body := tt.in.do(http.MethodGet, tt.path, tt.token)
			if got != tt.status || (tt.role != "" && body != tt.role) {
				t.Errorf("GET %s = %d %s, want %d %s", tt.path, got, body, tt.status, tt.role)
			}
		})
	}

	// The phone changes in MySQL (an operator's edit): the instance that
	// remembered the admin keeps it at most adminFor.
	if err := db.Exec("UPDATE users SET phone = ? WHERE id = ?", fmt.Sprintf("139%08d", testenv.ID()%100_000_000), id).Error; err != nil {
		t.Fatal(err)
	}
	before.expect(t, "admin within adminFor of the edit", "/admin", admin, http.StatusOK)
	clock.add(adminFor)
	before.expect(t, "admin adminFor after the edit", "/admin", admin, http.StatusForbidden)
	if got, body := before.do(http.MethodGet, "/me", admin); body != "user" {
		t.Errorf("role adminFor after the edit: %d %s, want user", got, body)
	}

	// A user who is no more (deleted) is nobody's admin.
	if err := db.Exec("DELETE FROM users WHERE id = ?", id).Error; err != nil {
		t.Fatal(err)
	}
	fresh := newAuthInstance(db, rdb, clock, phone)
	fresh.expect(t, "admin whose user is gone", "/admin", admin, http.StatusForbidden)
}
