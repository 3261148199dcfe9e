package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/golang-jwt/jwt/v5"
	"github.com/redis/go-redis/v9"

	"seckill/internal/auth"
	"seckill/internal/idworker"
	"seckill/internal/lock"
	"seckill/internal/order"
	"seckill/internal/testenv"
)

// The tests in this file walk the contract's table of error codes (and the
// conventions around it) over HTTP, against in-process instances on real
// MySQL and Redis.

// digits is what every ID in a JSON body must look like.
var digits = regexp.MustCompile(`^[1-9][0-9]*$`)

// apiPhone returns a random phone number, so that tests sharing one Redis
// never share a login code key.
func apiPhone() string { return fmt.Sprintf("139%08d", testenv.ID()%100_000_000) }

// apiServer is one instance on a fresh stack, with an admin of its own.
type apiServer struct {
	stack
	*instance
	AdminToken, AdminID string
}

// startAPI starts an instance on a fresh stack whose admin phone is
// unique to the test; extra are more environment variables.
func startAPI(t *testing.T, extra ...string) apiServer {
	t.Helper()
	return startAPIOn(t, newStack(t, 0), extra...)
}

// startAPIOn is startAPI on the given stack.
func startAPIOn(t *testing.T, st stack, extra ...string) apiServer {
	t.Helper()
	admin := apiPhone()
	in := start(t, st.env(freeAddr(t), append([]string{"ADMIN_PHONES", admin}, extra...)...))
	tok, id := mustLogin(t, in.Base, admin)
	return apiServer{stack: st, instance: in, AdminToken: tok, AdminID: id}
}

// db opens the stack's MySQL database.
func (s apiServer) db(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", s.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// apiDo sends a request with the given headers and returns the reply and
// the response headers. A string body with unknownLength is sent chunked.
func apiDo(t *testing.T, method, url string, header http.Header, body string, unknownLength bool) (reply, http.Header) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
		if unknownLength {
			rd = io.MultiReader(rd) // hides the length: sent chunked
		}
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, vs := range header {
		req.Header[k] = vs
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	r := reply{Status: resp.StatusCode, Raw: string(raw)}
	if err := json.Unmarshal(raw, &r.Body); err != nil {
		t.Fatalf("%s %s: answer is not JSON: %q", method, url, raw)
	}
	return r, resp.Header
}

// expectError checks that r is the contract's error envelope with code
// and status, and nothing else.
func expectError(t *testing.T, r reply, status int, code string) {
	t.Helper()
	if r.Status != status || r.Code() != code {
		t.Errorf("got %d %s, want %d %s", r.Status, r.Raw, status, code)
		return
	}
	if len(r.Body) != 1 {
		t.Errorf("envelope has other top-level fields: %s", r.Raw)
	}
	e, _ := r.Body["error"].(map[string]any)
	if len(e) != 2 {
		t.Errorf(`error object must hold exactly "code" and "message": %s`, r.Raw)
	}
	if msg, _ := e["message"].(string); strings.TrimSpace(msg) == "" {
		t.Errorf("error without a message: %s", r.Raw)
	}
}

// expectID checks that field of r's body is an ID as the contract writes
// it: a JSON string of decimal digits.
func expectID(t *testing.T, r reply, field string) string {
	t.Helper()
	v, ok := r.Body[field].(string)
	if !ok || !digits.MatchString(v) {
		t.Errorf("%s = %#v, want a string of decimal digits (%s)", field, r.Body[field], r.Raw)
	}
	return v
}

// voucherStock reads GET /vouchers/{id}'s stock.
func voucherStock(t *testing.T, base, id string) int {
	t.Helper()
	r := mustCall(t, "GET", base+"/vouchers/"+id, "", nil)
	if r.Status != http.StatusOK {
		t.Fatalf("GET voucher %s: %d %s", id, r.Status, r.Raw)
	}
	n, ok := r.Body["stock"].(float64)
	if !ok {
		t.Fatalf("stock is not a number: %s", r.Raw)
	}
	return int(n)
}

// forge mints a token with method and key for user sub with role,
// expiring at exp.
func forge(t *testing.T, method jwt.SigningMethod, key any, sub, role string, exp time.Time) string {
	t.Helper()
	s, err := jwt.NewWithClaims(method, jwt.MapClaims{"sub": sub, "role": role, "exp": exp.Unix(), "iat": time.Now().Unix()}).SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// checkToken checks a token as the contract describes it: an HS256 JWT
// with sub the user ID, role, and exp two hours on by default.
func checkToken(t *testing.T, token string, userID any, role string) {
	t.Helper()
	var c jwt.MapClaims
	parsed, err := jwt.NewParser(jwt.WithValidMethods([]string{"HS256"})).ParseWithClaims(token, &c, func(*jwt.Token) (any, error) { return []byte(testSecret), nil })
	if err != nil {
		t.Errorf("token %q does not verify as HS256 with JWT_SECRET: %v", token, err)
		return
	}
	if parsed.Header["alg"] != "HS256" || c["sub"] != userID || c["role"] != role {
		t.Errorf("token header %v, claims %v; want HS256, sub %v, role %s", parsed.Header, c, userID, role)
	}
	exp, err := c.GetExpirationTime()
	if err != nil || exp == nil || time.Until(exp.Time) < 2*time.Hour-time.Minute || time.Until(exp.Time) > 2*time.Hour+time.Minute {
		t.Errorf("exp = %v (%v), want two hours from now", exp, err)
	}
}

func TestAPIErrorCodes(t *testing.T) {
	s := startAPI(t)
	base := s.Base
	userTok, _ := mustLogin(t, base, apiPhone())
	voucherID := openVoucher(t, base, s.AdminToken, 10)
	future, past := time.Now().Add(time.Hour), time.Now().Add(-time.Hour)
	rfc := func(t time.Time) string { return t.UTC().Format(time.RFC3339) }
	unknownID := strconv.FormatInt(1<<62+testenv.ID()%1_000_000, 10)

	t.Run("invalid_argument", func(t *testing.T) {
		valid := func(change map[string]any) map[string]any {
			v := map[string]any{"title": "t", "stock": 5, "begin_time": rfc(past), "end_time": rfc(future)}
			for k, x := range change {
				if x == nil {
					delete(v, k)
				} else {
					v[k] = x
				}
			}
			return v
		}
		tests := []struct {
			name, method, path, token string
			body                      any
		}{
			{"malformed JSON", "POST", "/vouchers", s.AdminToken, `{"title": "t", "stock":`},
			{"not an object", "POST", "/vouchers", s.AdminToken, `[1, 2]`},
			{"empty body", "POST", "/vouchers", s.AdminToken, nil},
			{"stock of the wrong type", "POST", "/vouchers", s.AdminToken, valid(map[string]any{"stock": "ten"})},
			{"missing title", "POST", "/vouchers", s.AdminToken, valid(map[string]any{"title": nil})},
			{"blank title", "POST", "/vouchers", s.AdminToken, valid(map[string]any{"title": "  "})},
			{"title over 255 characters", "POST", "/vouchers", s.AdminToken, valid(map[string]any{"title": strings.Repeat("券", 256)})},
			{"missing stock", "POST", "/vouchers", s.AdminToken, valid(map[string]any{"stock": nil})},
			{"missing begin_time", "POST", "/vouchers", s.AdminToken, valid(map[string]any{"begin_time": nil})},
			{"missing end_time", "POST", "/vouchers", s.AdminToken, valid(map[string]any{"end_time": nil})},
			{"all fields missing", "POST", "/vouchers", s.AdminToken, map[string]any{}},
			{"stock below zero", "POST", "/vouchers", s.AdminToken, valid(map[string]any{"stock": -1})},
			{"stock beyond INT", "POST", "/vouchers", s.AdminToken, valid(map[string]any{"stock": int64(1) << 31})},
			{"fractional stock", "POST", "/vouchers", s.AdminToken, valid(map[string]any{"stock": 1.5})},
			{"begin equals end", "POST", "/vouchers", s.AdminToken, valid(map[string]any{"end_time": rfc(past)})},
			{"begin after end", "POST", "/vouchers", s.AdminToken, valid(map[string]any{"begin_time": rfc(future), "end_time": rfc(past)})},
			{"time not RFC 3339", "POST", "/vouchers", s.AdminToken, valid(map[string]any{"begin_time": "tomorrow"})},
			{"phone too short", "POST", "/auth/code", "", map[string]string{"phone": "1380000000"}},
			{"phone too long", "POST", "/auth/code", "", map[string]string{"phone": "138000000000"}},
			{"phone not starting with 1", "POST", "/auth/code", "", map[string]string{"phone": "23800000000"}},
			{"phone with a letter", "POST", "/auth/code", "", map[string]string{"phone": "1380000000a"}},
			{"phone with country code", "POST", "/auth/code", "", map[string]string{"phone": "+8613800000000"}},
			{"missing phone", "POST", "/auth/code", "", map[string]string{}},
			{"phone as a number", "POST", "/auth/code", "", map[string]any{"phone": 13800000000}},
			{"malformed JSON to auth/code", "POST", "/auth/code", "", `{"phone"`},
			{"login with a bad phone", "POST", "/auth/login", "", map[string]string{"phone": "12", "code": "123456"}},
			{"login with a short code", "POST", "/auth/login", "", map[string]string{"phone": apiPhone(), "code": "12345"}},
			{"login with a non-numeric code", "POST", "/auth/login", "", map[string]string{"phone": apiPhone(), "code": "abcdef"}},
			{"login without code", "POST", "/auth/login", "", map[string]string{"phone": apiPhone()}},
			{"voucher ID not numeric", "GET", "/vouchers/abc", "", nil},
			{"voucher ID zero", "GET", "/vouchers/0", "", nil},
			{"voucher ID negative", "GET", "/vouchers/-1", "", nil},
			{"voucher ID fractional", "GET", "/vouchers/1.5", "", nil},
			{"voucher ID beyond 63 bits", "GET", "/vouchers/9223372036854775808", "", nil},
			{"seckill voucher ID not numeric", "POST", "/seckill/abc", userTok, nil},
			{"seckill voucher ID in hex", "POST", "/seckill/0x10", userTok, nil},
			{"order ID not numeric", "GET", "/orders/abc", userTok, nil},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				expectError(t, mustCall(t, tt.method, base+tt.path, tt.token, tt.body), http.StatusBadRequest, "invalid_argument")
			})
		}
	})

	t.Run("body over 1 MiB is 413", func(t *testing.T) {
		big := `{"title": "` + strings.Repeat("a", 2<<20) + `", "stock": 1}`
		admin := http.Header{"Authorization": {"Bearer " + s.AdminToken}}
		tests := []struct {
			name          string
			path          string
			header        http.Header
			unknownLength bool
		}{
			{"declared length, admin endpoint", "/vouchers", admin, false},
			{"declared length, public endpoint", "/auth/code", nil, false},
			{"chunked, admin endpoint", "/vouchers", admin, true},
			{"chunked, public endpoint", "/auth/login", nil, true},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				r, _ := apiDo(t, "POST", base+tt.path, tt.header, big, tt.unknownLength)
				expectError(t, r, http.StatusRequestEntityTooLarge, "invalid_argument")
			})
		}
	})

	t.Run("unauthorized", func(t *testing.T) {
		exp := time.Now().Add(time.Hour)
		tests := []struct {
			name   string
			header string // the Authorization header; "" for none
		}{
			{"no token", ""},
			{"bearer without token", "Bearer "},
			{"bearer garbage", "Bearer garbage"},
			{"bearer three garbage parts", "Bearer a.b.c"},
			{"token without scheme", s.AdminToken},
			{"basic auth", "Basic YWRtaW46YWRtaW4="},
			{"alg none", "Bearer " + forge(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, s.AdminID, "admin", exp)},
			{"signed with another key", "Bearer " + forge(t, jwt.SigningMethodHS256, []byte("another-secret-0123456789abcdef"), s.AdminID, "admin", exp)},
			{"HS512 with the server's key", "Bearer " + forge(t, jwt.SigningMethodHS512, []byte(testSecret), s.AdminID, "admin", exp)},
			{"expired", "Bearer " + forge(t, jwt.SigningMethodHS256, []byte(testSecret), s.AdminID, "admin", time.Now().Add(-time.Minute))},
			{"unknown role", "Bearer " + forge(t, jwt.SigningMethodHS256, []byte(testSecret), s.AdminID, "root", exp)},
			{"non-numeric sub", "Bearer " + forge(t, jwt.SigningMethodHS256, []byte(testSecret), "admin", "admin", exp)},
		}
		// Every authenticated endpoint, with a body that would succeed.
		endpoints := []struct{ method, path, body string }{
			{"POST", "/vouchers", fmt.Sprintf(`{"title": "t", "stock": 1, "begin_time": %q, "end_time": %q}`, rfc(past), rfc(future))},
			{"POST", "/seckill/" + voucherID, ""},
			{"GET", "/orders/1", ""},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				var h http.Header
				if tt.header != "" {
					h = http.Header{"Authorization": {tt.header}}
				}
				for _, e := range endpoints {
					r, hdr := apiDo(t, e.method, base+e.path, h, e.body, false)
					expectError(t, r, http.StatusUnauthorized, "unauthorized")
					if ct := hdr.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
						t.Errorf("%s %s: Content-Type %q", e.method, e.path, ct)
					}
				}
			})
		}
		// The control: a token made the same way with the server's key is
		// honoured, so the forgeries above fail for their reason.
		t.Run("control: a well-made token is honoured", func(t *testing.T) {
			tok := forge(t, jwt.SigningMethodHS256, []byte(testSecret), s.AdminID, "admin", exp)
			r, _ := apiDo(t, "POST", base+"/vouchers", http.Header{"Authorization": {"Bearer " + tok}}, endpoints[0].body, false)
			if r.Status != http.StatusCreated {
				t.Errorf("POST /vouchers with a well-made token: %d %s", r.Status, r.Raw)
			}
		})
		// Token checks come before anything else, even a bad path ID.
		t.Run("token before path ID", func(t *testing.T) {
			expectError(t, mustCall(t, "POST", base+"/seckill/abc", "", nil), http.StatusUnauthorized, "unauthorized")
			expectError(t, mustCall(t, "POST", base+"/seckill/"+unknownID, "", nil), http.StatusUnauthorized, "unauthorized")
		})
	})

	t.Run("unauthorized login codes", func(t *testing.T) {
		sendCode := func(t *testing.T, phone string) string {
			t.Helper()
			r := mustCall(t, "POST", base+"/auth/code", "", map[string]string{"phone": phone})
			if r.Status != http.StatusOK || r.Body["sent"] != true || len(r.Str("code")) != 6 {
				t.Fatalf("auth/code: %d %s", r.Status, r.Raw)
			}
			return r.Str("code")
		}
		loginWith := func(t *testing.T, phone, code string) reply {
			t.Helper()
			return mustCall(t, "POST", base+"/auth/login", "", map[string]string{"phone": phone, "code": code})
		}
		wrong := func(code string) string {
			n, _ := strconv.Atoi(code)
			return fmt.Sprintf("%06d", (n+1)%1_000_000)
		}

		t.Run("wrong code, then the right one", func(t *testing.T) {
			phone := apiPhone()
			code := sendCode(t, phone)
			expectError(t, loginWith(t, phone, wrong(code)), http.StatusUnauthorized, "unauthorized")
			r := loginWith(t, phone, code)
			if r.Status != http.StatusOK {
				t.Fatalf("login with the right code after one wrong try: %d %s", r.Status, r.Raw)
			}
			u, _ := r.Body["user"].(map[string]any)
			expectID(t, reply{Body: u, Raw: r.Raw}, "id")
			if u["phone"] != phone {
				t.Errorf("user.phone = %v, want %s", u["phone"], phone)
			}
			checkToken(t, r.Str("token"), u["id"], "user")
			t.Run("code reused after a successful login", func(t *testing.T) {
				expectError(t, loginWith(t, phone, code), http.StatusUnauthorized, "unauthorized")
			})
		})
		t.Run("no code was ever sent", func(t *testing.T) {
			expectError(t, loginWith(t, apiPhone(), "123456"), http.StatusUnauthorized, "unauthorized")
		})
		// Wrong tries do not burn the code: a stranger could burn the
		// owner's (issue 22); the guesser's address waits instead.
		t.Run("wrong tries do not burn the code", func(t *testing.T) {
			phone := apiPhone()
			code := sendCode(t, phone)
			for range 5 {
				expectError(t, loginWith(t, phone, wrong(code)), http.StatusUnauthorized, "unauthorized")
			}
			if r := loginWith(t, phone, code); r.Status != http.StatusOK {
				t.Errorf("the right code after five wrong tries: %d %s", r.Status, r.Raw)
			}
		})
		// A new code does not replace the old one: a stranger asking for
		// codes would otherwise void the one the owner just received.
		t.Run("a new code does not replace the old one", func(t *testing.T) {
			phone := apiPhone()
			old := sendCode(t, phone)
			code := sendCode(t, phone)
			if r := loginWith(t, phone, code); r.Status != http.StatusOK {
				t.Errorf("login with the newest code: %d %s", r.Status, r.Raw)
			}
			if old != code {
				if r := loginWith(t, phone, old); r.Status != http.StatusOK {
					t.Errorf("login with the older code: %d %s", r.Status, r.Raw)
				}
			}
		})
		t.Run("admin token", func(t *testing.T) {
			checkToken(t, s.AdminToken, s.AdminID, "admin")
		})
		t.Run("same user on every login", func(t *testing.T) {
			phone := apiPhone()
			_, first := mustLogin(t, base, phone)
			_, again := mustLogin(t, base, phone)
			if first != again {
				t.Errorf("second login of %s is user %s, first was %s", phone, again, first)
			}
		})
	})

	t.Run("forbidden", func(t *testing.T) {
		r := mustCall(t, "POST", base+"/vouchers", userTok, map[string]any{
			"title": "t", "stock": 1, "begin_time": rfc(past), "end_time": rfc(future),
		})
		expectError(t, r, http.StatusForbidden, "forbidden")
	})

	t.Run("not_found", func(t *testing.T) {
		tests := []struct{ name, method, path, token string }{
			{"unknown voucher", "GET", "/vouchers/" + unknownID, ""},
			{"seckill of an unknown voucher", "POST", "/seckill/" + unknownID, userTok},
			{"unknown order", "GET", "/orders/" + unknownID, userTok},
			{"unknown order, asked by an admin", "GET", "/orders/" + unknownID, s.AdminToken},
			{"unknown route", "GET", "/no/such/route", ""},
			{"unknown route with a token", "POST", "/vouchers/" + voucherID + "/buy", userTok},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				expectError(t, mustCall(t, tt.method, base+tt.path, tt.token, nil), http.StatusNotFound, "not_found")
			})
		}
	})

	t.Run("wrong method is an error in the envelope", func(t *testing.T) {
		r := mustCall(t, "DELETE", base+"/vouchers/"+voucherID, s.AdminToken, nil)
		if r.Status < 400 || r.Status >= 500 || r.Code() == "" {
			t.Errorf("DELETE /vouchers/{id}: %d %s; want a 4xx in the envelope", r.Status, r.Raw)
		}
	})

	t.Run("sale window", func(t *testing.T) {
		notStarted := createVoucher(t, base, s.AdminToken, 5, future, future.Add(time.Hour))
		ended := createVoucher(t, base, s.AdminToken, 5, past.Add(-time.Hour), past)
		// The window is checked before the stock.
		notStartedEmpty := createVoucher(t, base, s.AdminToken, 0, future, future.Add(time.Hour))
		endedEmpty := createVoucher(t, base, s.AdminToken, 0, past.Add(-time.Hour), past)
		tests := []struct {
			name, voucher, code string
			stock               int
		}{
			{"not_started", notStarted, "not_started", 5},
			{"ended", ended, "ended", 5},
			{"not_started beats sold_out", notStartedEmpty, "not_started", 0},
			{"ended beats sold_out", endedEmpty, "ended", 0},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				expectError(t, mustCall(t, "POST", base+"/seckill/"+tt.voucher, userTok, nil), http.StatusConflict, tt.code)
				if n := voucherStock(t, base, tt.voucher); n != tt.stock {
					t.Errorf("stock = %d, want %d", n, tt.stock)
				}
			})
		}
	})

	t.Run("sold_out and already_ordered", func(t *testing.T) {
		v := openVoucher(t, base, s.AdminToken, 1)
		first, _ := mustLogin(t, base, apiPhone())
		second, _ := mustLogin(t, base, apiPhone())
		r := mustCall(t, "POST", base+"/seckill/"+v, first, nil)
		if r.Status != http.StatusOK {
			t.Fatalf("first seckill: %d %s", r.Status, r.Raw)
		}
		expectID(t, r, "order_id")
		expectError(t, mustCall(t, "POST", base+"/seckill/"+v, second, nil), http.StatusConflict, "sold_out")
		// Both sold_out and already_ordered apply: either may be answered.
		r = mustCall(t, "POST", base+"/seckill/"+v, first, nil)
		if r.Code() != "already_ordered" && r.Code() != "sold_out" {
			t.Errorf("second seckill of the buyer: %d %s", r.Status, r.Raw)
		}
		expectError(t, r, http.StatusConflict, r.Code())

		empty := openVoucher(t, base, s.AdminToken, 0)
		expectError(t, mustCall(t, "POST", base+"/seckill/"+empty, first, nil), http.StatusConflict, "sold_out")

		plenty := openVoucher(t, base, s.AdminToken, 5)
		if r := mustCall(t, "POST", base+"/seckill/"+plenty, second, nil); r.Status != http.StatusOK {
			t.Fatalf("seckill: %d %s", r.Status, r.Raw)
		}
		expectError(t, mustCall(t, "POST", base+"/seckill/"+plenty, second, nil), http.StatusConflict, "already_ordered")
		if n := voucherStock(t, base, plenty); n != 4 {
			t.Errorf("stock after one order and one refusal = %d, want 4", n)
		}
	})

	t.Run("busy", func(t *testing.T) {
		v := openVoucher(t, base, s.AdminToken, 5)
		tok, uid := mustLogin(t, base, apiPhone())
		// Hold the user's lock as another request of theirs would; the
		// Redis key under the name is the lock package's business, so the
		// lock package takes it.
		vid, _ := strconv.ParseInt(v, 10, 64)
		userID, _ := strconv.ParseInt(uid, 10, 64)
		lk, err := lock.NewRedis(testenv.Redis(t, s.RedisDB)).Obtain(context.Background(), order.UserLockKey(vid, userID), 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer lk.Release(context.Background())
		r := mustCall(t, "POST", base+"/seckill/"+v, tok, nil)
		expectError(t, r, http.StatusTooManyRequests, "busy")
		if got := r.Header.Get("Retry-After"); got != "1" {
			t.Errorf("busy: Retry-After %q, want 1 (the other request is done within a second)", got)
		}
		if n := voucherStock(t, base, v); n != 5 {
			t.Errorf("stock after busy = %d, want 5: the unit was not given back", n)
		}
		var orders int
		if err := s.db(t).QueryRow("SELECT COUNT(*) FROM voucher_orders WHERE voucher_id = ?", v).Scan(&orders); err != nil || orders != 0 {
			t.Errorf("orders after busy: %d (%v), want 0", orders, err)
		}
		// Once the other request is done, the user may buy: busy left
		// nothing behind (neither the unit nor the user as a buyer).
		if err := lk.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		if r := mustCall(t, "POST", base+"/seckill/"+v, tok, nil); r.Status != http.StatusOK {
			t.Errorf("seckill after the lock was released: %d %s", r.Status, r.Raw)
		}
		if n := voucherStock(t, base, v); n != 4 {
			t.Errorf("stock = %d, want 4", n)
		}
	})

	t.Run("health", func(t *testing.T) {
		for _, path := range []string{"/healthz", "/readyz"} {
			if r := mustCall(t, "GET", base+path, "", nil); r.Status != http.StatusOK {
				t.Errorf("%s: %d %s", path, r.Status, r.Raw)
			}
		}
	})

	t.Run("invariant at rest", func(t *testing.T) {
		rows, err := s.db(t).Query(`SELECT v.id, v.stock, v.initial_stock,
			(SELECT COUNT(*) FROM voucher_orders o WHERE o.voucher_id = v.id) FROM vouchers v`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var id, left, initial, orders int64
			if err := rows.Scan(&id, &left, &initial, &orders); err != nil {
				t.Fatal(err)
			}
			if left+orders != initial {
				t.Errorf("voucher %d: stock %d + orders %d != initial %d", id, left, orders, initial)
			}
		}
	})
}

func TestAPIVouchersAndOrders(t *testing.T) {
	s := startAPI(t)
	base := s.Base
	begin := time.Now().Add(-time.Minute).UTC().Truncate(time.Second)
	end := begin.Add(2 * time.Hour)

	r := mustCall(t, "POST", base+"/vouchers", s.AdminToken, map[string]any{
		"title": "  Coffee, half price  ", "stock": 3,
		"begin_time": begin.Format(time.RFC3339), "end_time": end.In(time.FixedZone("UTC+8", 8*3600)).Format(time.RFC3339),
	})
	if r.Status != http.StatusCreated {
		t.Fatalf("create voucher: %d %s", r.Status, r.Raw)
	}
	v := expectID(t, r, "id")
	t.Run("created voucher", func(t *testing.T) {
		got := mustCall(t, "GET", base+"/vouchers/"+v, "", nil)
		for name, reply := range map[string]reply{"POST": r, "GET": got} {
			if reply.Str("id") != v || reply.Body["stock"] != 3.0 || reply.Str("title") == "" {
				t.Errorf("%s: %s", name, reply.Raw)
			}
			for field, want := range map[string]time.Time{"begin_time": begin, "end_time": end} {
				at, err := time.Parse(time.RFC3339, reply.Str(field))
				if err != nil || !at.Equal(want) {
					t.Errorf("%s: %s = %q, want %s as RFC 3339", name, field, reply.Str(field), want.Format(time.RFC3339))
				}
			}
		}
	})

	buyer, buyerID := mustLogin(t, base, apiPhone())
	other, _ := mustLogin(t, base, apiPhone())
	var orderID string
	t.Run("stock goes down with each order", func(t *testing.T) {
		for i, tok := range []string{buyer, other} {
			r := mustCall(t, "POST", base+"/seckill/"+v, tok, nil)
			if r.Status != http.StatusOK {
				t.Fatalf("seckill %d: %d %s", i, r.Status, r.Raw)
			}
			id := expectID(t, r, "order_id")
			if i == 0 {
				orderID = id
			}
			if n := voucherStock(t, base, v); n != 3-(i+1) {
				t.Errorf("stock after %d orders = %d, want %d", i+1, n, 3-(i+1))
			}
		}
	})
	if orderID == "" {
		t.Fatal("no order")
	}

	t.Run("order ID layout", func(t *testing.T) {
		id, err := strconv.ParseInt(orderID, 10, 64)
		if err != nil || id <= 0 {
			t.Fatalf("order_id %q is not a positive 63-bit integer", orderID)
		}
		made, seq := idworker.Parts(id)
		if d := time.Since(made); d < -2*time.Second || d > time.Minute {
			t.Errorf("order_id %s says it was made at %s", orderID, made)
		}
		if seq < 1 {
			t.Errorf("order_id %s has sequence %d", orderID, seq)
		}
	})

	t.Run("owner reads the order", func(t *testing.T) {
		r := mustCall(t, "GET", base+"/orders/"+orderID, buyer, nil)
		if r.Status != http.StatusOK {
			t.Fatalf("GET own order: %d %s", r.Status, r.Raw)
		}
		for field, want := range map[string]string{"id": orderID, "user_id": buyerID, "voucher_id": v} {
			if got := expectID(t, r, field); got != want {
				t.Errorf("%s = %s, want %s", field, got, want)
			}
		}
		if r.Str("status") != "unpaid" {
			t.Errorf("status = %q, want unpaid (sync mode)", r.Str("status"))
		}
		at, err := time.Parse(time.RFC3339, r.Str("created_at"))
		if err != nil || time.Since(at) > time.Minute || time.Until(at) > 2*time.Second {
			t.Errorf("created_at = %q (%v)", r.Str("created_at"), err)
		}
	})
	t.Run("someone else's order is not_found", func(t *testing.T) {
		expectError(t, mustCall(t, "GET", base+"/orders/"+orderID, other, nil), http.StatusNotFound, "not_found")
		stranger, _ := mustLogin(t, base, apiPhone())
		expectError(t, mustCall(t, "GET", base+"/orders/"+orderID, stranger, nil), http.StatusNotFound, "not_found")
	})
	t.Run("admin reads anyone's order", func(t *testing.T) {
		r := mustCall(t, "GET", base+"/orders/"+orderID, s.AdminToken, nil)
		if r.Status != http.StatusOK || r.Str("id") != orderID || r.Str("user_id") != buyerID {
			t.Errorf("admin GET order: %d %s", r.Status, r.Raw)
		}
	})
	t.Run("the row is in MySQL", func(t *testing.T) {
		var user, voucher int64
		var status string
		if err := s.db(t).QueryRow("SELECT user_id, voucher_id, status FROM voucher_orders WHERE id = ?", orderID).Scan(&user, &voucher, &status); err != nil {
			t.Fatal(err)
		}
		if strconv.FormatInt(user, 10) != buyerID || strconv.FormatInt(voucher, 10) != v || status != "unpaid" {
			t.Errorf("row: user %d voucher %d status %s", user, voucher, status)
		}
	})

	t.Run("Idempotency-Key", func(t *testing.T) {
		body := fmt.Sprintf(`{"title": "idem", "stock": 1, "begin_time": %q, "end_time": %q}`, begin.Format(time.RFC3339), end.Format(time.RFC3339))
		post := func(t *testing.T, token, key string) reply {
			t.Helper()
			h := http.Header{"Authorization": {"Bearer " + token}}
			if key != "" {
				h.Set("Idempotency-Key", key)
			}
			r, _ := apiDo(t, "POST", base+"/vouchers", h, body, false)
			return r
		}
		key := testenv.Name("idem-")
		first := post(t, s.AdminToken, key)
		if first.Status != http.StatusCreated {
			t.Fatalf("first: %d %s", first.Status, first.Raw)
		}
		expectError(t, post(t, s.AdminToken, key), http.StatusTooManyRequests, "busy")
		if r := post(t, s.AdminToken, testenv.Name("idem-")); r.Status != http.StatusCreated {
			t.Errorf("a different key: %d %s", r.Status, r.Raw)
		}
		for range 2 {
			if r := post(t, s.AdminToken, ""); r.Status != http.StatusCreated {
				t.Errorf("no key: %d %s", r.Status, r.Raw)
			}
		}
		var n int
		if err := s.db(t).QueryRow("SELECT COUNT(*) FROM vouchers WHERE title = 'idem'").Scan(&n); err != nil || n != 4 {
			t.Errorf("%d vouchers made (%v), want 4: the refused repeat made none", n, err)
		}
	})
}

// privateRedis starts a redis-server of the test's own, without
// persistence, and returns its address and a function that kills it.
func privateRedis(t *testing.T) (string, func()) {
	t.Helper()
	testenv.Integration(t, "redis-server")
	path, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("SECKILL_REQUIRE_INTEGRATION") == "1" {
			t.Fatalf("redis-server is not on PATH and SECKILL_REQUIRE_INTEGRATION=1")
		}
		t.Skip("redis-server is not on PATH")
	}
	addr := freeAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command(path, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	if err := cmd.Start(); err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	var once sync.Once
	kill := func() {
		once.Do(func() {
			cmd.Process.Kill()
			cmd.Wait()
		})
	}
	t.Cleanup(kill)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for rdb.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on %s did not answer in 10s", addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return addr, kill
}

func TestAPIUnavailableWhenRedisGoes(t *testing.T) {
	st := newStack(t, 0) // for MySQL; Redis is the test's own
	redisAddr, kill := privateRedis(t)
	s := startAPIOn(t, st, "REDIS_ADDR", redisAddr, "REDIS_DB", "0")
	base := s.Base
	v := openVoucher(t, base, s.AdminToken, 5)
	user, _ := mustLogin(t, base, apiPhone())
	if n := voucherStock(t, base, v); n != 5 {
		t.Fatalf("stock = %d", n)
	}

	kill()

	t.Run("seckill", func(t *testing.T) {
		expectError(t, mustCall(t, "POST", base+"/seckill/"+v, user, nil), http.StatusServiceUnavailable, "unavailable")
	})
	t.Run("other endpoints", func(t *testing.T) {
		expectError(t, mustCall(t, "GET", base+"/vouchers/"+v, "", nil), http.StatusServiceUnavailable, "unavailable")
		expectError(t, mustCall(t, "POST", base+"/auth/code", "", map[string]string{"phone": apiPhone()}), http.StatusServiceUnavailable, "unavailable")
	})
	t.Run("readyz is 503, healthz 200", func(t *testing.T) {
		if r := mustCall(t, "GET", base+"/readyz", "", nil); r.Status != http.StatusServiceUnavailable {
			t.Errorf("/readyz: %d %s", r.Status, r.Raw)
		}
		if r := mustCall(t, "GET", base+"/healthz", "", nil); r.Status != http.StatusOK {
			t.Errorf("/healthz: %d %s", r.Status, r.Raw)
		}
	})
	t.Run("nothing was taken", func(t *testing.T) {
		var left, orders int
		db := s.db(t)
		if err := db.QueryRow("SELECT stock FROM vouchers WHERE id = ?", v).Scan(&left); err != nil || left != 5 {
			t.Errorf("vouchers.stock = %d (%v), want 5", left, err)
		}
		if err := db.QueryRow("SELECT COUNT(*) FROM voucher_orders WHERE voucher_id = ?", v).Scan(&orders); err != nil || orders != 0 {
			t.Errorf("orders = %d (%v), want 0", orders, err)
		}
	})
}

// TestAPIPanicIsInternal checks the no-panic guarantee: a handler that
// panics answers 500 internal in the envelope, with nothing of the panic in
// the message, and the server goes on serving.
func TestAPIPanicIsInternal(t *testing.T) {
	st := newStack(t, 0)
	env := st.env(freeAddr(t))
	cfg, err := loadConfig(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	stores, err := openStores(context.Background(), cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stores.close)
	if stores.truth != nil {
		t.Error("a pool for causal reads opened on one MariaDB, not a Galera cluster")
	}
	a, err := newApp(cfg, stores, log)
	if err != nil {
		t.Fatal(err)
	}
	const secret = "dial tcp 10.0.0.7:3306: password=hunter2"
	a.router.GET("/test/panic", func(*gin.Context) { panic(secret) })
	a.router.GET("/test/panic-error", func(*gin.Context) { panic(fmt.Errorf("wrapped: %s", secret)) })
	a.router.POST("/test/panic-after-read", func(c *gin.Context) {
		io.ReadAll(c.Request.Body)
		var m map[string]any
		_ = m["x"].(string) // a nil map and a failed type assertion: a runtime panic
	})
	srv := httptest.NewServer(a.router)
	t.Cleanup(srv.Close)

	tests := []struct{ name, method, path string }{
		{"panic with a string", "GET", "/test/panic"},
		{"panic with an error", "GET", "/test/panic-error"},
		{"runtime error", "POST", "/test/panic-after-read"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, hdr := apiDo(t, tt.method, srv.URL+tt.path, nil, `{"a": 1}`, false)
			expectError(t, r, http.StatusInternalServerError, "internal")
			for _, leak := range []string{"hunter2", "10.0.0.7", "panic", "goroutine", ".go:", "interface conversion"} {
				if strings.Contains(r.Raw, leak) {
					t.Errorf("answer reveals %q: %s", leak, r.Raw)
				}
			}
			if ct := hdr.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
				t.Errorf("Content-Type %q", ct)
			}
		})
	}
	t.Run("the panic is logged", func(t *testing.T) {
		if !strings.Contains(logs.String(), "hunter2") {
			t.Errorf("the log does not hold the panic's value:\n%s", logs.String())
		}
	})
	t.Run("the server still serves", func(t *testing.T) {
		if r := mustCall(t, "GET", srv.URL+"/healthz", "", nil); r.Status != http.StatusOK {
			t.Errorf("/healthz after panics: %d %s", r.Status, r.Raw)
		}
	})
}

// defaultCodeLimits put the login code limits the harness turns off back
// to their defaults (an empty value is the default), and trust the test's
// own address, 127.0.0.1, as a proxy: each test then names a client
// address of its own in X-Forwarded-For, and tests sharing Redis never
// share an address's count.
var defaultCodeLimits = []string{
	"AUTH_CODE_INTERVAL", "",
	"AUTH_CODES_PER_DAY", "",
	"AUTH_CODES_PER_ADDR_PER_MIN", "",
	// The pair's free guesses (phone, address) back to the default; not
	// the address's, counted over all phones: 127.0.0.1 guesses wrong in
	// many tests, run after run, and its count lasts an hour (the address
	// limit has its tests in package auth).
	"AUTH_FREE_GUESSES", "",
	"TRUSTED_PROXIES", "127.0.0.1",
}

// clientAddr returns an address no other test uses, for X-Forwarded-For.
func clientAddr() string {
	n := testenv.ID()
	return fmt.Sprintf("10.%d.%d.%d", n>>16&0xff, n>>8&0xff, n&0xff)
}

// askCode asks for a login code for phone from client address addr
// (sent as X-Forwarded-For; "" for none).
func askCode(t *testing.T, base, phone, addr string) (reply, http.Header) {
	t.Helper()
	h := http.Header{}
	if addr != "" {
		h.Set("X-Forwarded-For", addr)
	}
	return apiDo(t, "POST", base+"/auth/code", h, fmt.Sprintf(`{"phone": %q}`, phone), false)
}

// logIn tries phone's code.
func logIn(t *testing.T, base, phone, code string) (reply, http.Header) {
	t.Helper()
	return apiDo(t, "POST", base+"/auth/login", nil, fmt.Sprintf(`{"phone": %q, "code": %q}`, phone, code), false)
}

// logInFrom tries phone's code from client address addr (sent as
// X-Forwarded-For).
func logInFrom(t *testing.T, base, phone, code, addr string) (reply, http.Header) {
	t.Helper()
	h := http.Header{"X-Forwarded-For": {addr}}
	return apiDo(t, "POST", base+"/auth/login", h, fmt.Sprintf(`{"phone": %q, "code": %q}`, phone, code), false)
}

// expectBusy checks a 429 busy in the envelope whose Retry-After is an
// integer number of seconds in [lo, hi].
func expectBusy(t *testing.T, r reply, h http.Header, lo, hi int) {
	t.Helper()
	expectError(t, r, http.StatusTooManyRequests, "busy")
	s := h.Get("Retry-After")
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n < lo || n > hi {
		t.Errorf("Retry-After %q, want whole seconds from %d to %d", s, lo, hi)
	}
}

// anotherCode is a 6-digit code that is not code.
func anotherCode(code string) string {
	n, _ := strconv.Atoi(code)
	return fmt.Sprintf("%06d", (n+1)%1_000_000)
}

// TestAPILoginCodeLimits drives the login code limits over HTTP, on
// an instance with the default limits.
func TestAPILoginCodeLimits(t *testing.T) {
	s := startAPI(t, defaultCodeLimits...)
	base := s.Base

	t.Run("a second code within 60s", func(t *testing.T) {
		phone, addr := apiPhone(), clientAddr()
		r, _ := askCode(t, base, phone, addr)
		if r.Status != http.StatusOK {
			t.Fatalf("first code: %d %s", r.Status, r.Raw)
		}
		code := r.Str("code")
		again, h := askCode(t, base, phone, addr)
		expectBusy(t, again, h, 55, 60)
		// From another address too: the limit is the phone's.
		again, h = askCode(t, base, phone, clientAddr())
		expectBusy(t, again, h, 55, 60)
		// The first code still logs in.
		if r, _ := logIn(t, base, phone, code); r.Status != http.StatusOK {
			t.Errorf("login with the first code: %d %s", r.Status, r.Raw)
		}
	})

	t.Run("21st code request from one address within a minute", func(t *testing.T) {
		addr := clientAddr()
		for i := range 20 {
			if r, _ := askCode(t, base, apiPhone(), addr); r.Status != http.StatusOK {
				t.Fatalf("request %d: %d %s", i+1, r.Status, r.Raw)
			}
		}
		r, h := askCode(t, base, apiPhone(), addr)
		expectBusy(t, r, h, 50, 60)
		// A client of the same proxy with another address is not slowed.
		if r, _ := askCode(t, base, apiPhone(), clientAddr()); r.Status != http.StatusOK {
			t.Errorf("another address: %d %s", r.Status, r.Raw)
		}
	})

	// Wrong guesses make the guessing address wait on that phone, from
	// the fourth on; another address is not slowed down, and no count
	// burns the code.
	t.Run("three free wrong guesses, then the address waits", func(t *testing.T) {
		phone, addr := apiPhone(), clientAddr()
		r, _ := askCode(t, base, phone, addr)
		code := r.Str("code")
		for range 4 {
			r, _ := logInFrom(t, base, phone, anotherCode(code), addr)
			expectError(t, r, http.StatusUnauthorized, "unauthorized")
		}
		r, h := logInFrom(t, base, phone, code, addr)
		expectBusy(t, r, h, 1, 1)
		if r, _ := logInFrom(t, base, phone, code, clientAddr()); r.Status != http.StatusOK {
			t.Errorf("the right code from another address: %d %s", r.Status, r.Raw)
		}
	})

	// Issue 22: strangers spend the phone's codes of the day and its wrong
	// guesses of the hour; the owner, from the address they logged in
	// from, still logs in, with the code they had and with a new one.
	t.Run("strangers cannot lock the owner out", func(t *testing.T) {
		s := startAPI(t, append(defaultCodeLimits, "AUTH_CODE_INTERVAL", "0", "AUTH_CODES_PER_DAY", "3", "AUTH_PHONE_GUESSES_PER_HOUR", "5")...)
		base := s.Base
		phone, owner := apiPhone(), clientAddr()
		r, _ := askCode(t, base, phone, owner) // counted: not trusted yet
		if r, _ := logInFrom(t, base, phone, r.Str("code"), owner); r.Status != http.StatusOK {
			t.Fatalf("the owner's first login: %d %s", r.Status, r.Raw)
		}
		r, _ = askCode(t, base, phone, owner) // trusted: not counted
		code := r.Str("code")
		for range 2 {
			if r, _ := askCode(t, base, phone, clientAddr()); r.Status != http.StatusOK {
				t.Fatalf("a stranger's code: %d %s", r.Status, r.Raw)
			}
		}
		r, h := askCode(t, base, phone, clientAddr())
		expectBusy(t, r, h, 23*3600, 24*3600)
		for range 4 {
			stranger := clientAddr()
			for range 5 {
				logInFrom(t, base, phone, anotherCode(code), stranger)
			}
		}
		r, h = logInFrom(t, base, phone, code, clientAddr())
		expectBusy(t, r, h, 59*60, 3600)
		if r, _ := logInFrom(t, base, phone, code, owner); r.Status != http.StatusOK {
			t.Errorf("the owner's login with the code they had: %d %s", r.Status, r.Raw)
		}
		r, _ = askCode(t, base, phone, owner)
		if r, _ := logInFrom(t, base, phone, r.Str("code"), owner); r.Status != http.StatusOK {
			t.Errorf("the owner's login with a new code: %d %s", r.Status, r.Raw)
		}
	})
}

// TestAPIClientAddress checks where the per-address limit takes the
// client's address from: the connection, and X-Forwarded-For only when
// the connection comes from a proxy in TRUSTED_PROXIES. It drives the
// server's router directly, so each request can come from any peer.
func TestAPIClientAddress(t *testing.T) {
	proxy := clientAddr()
	st := newStack(t, 0)
	env := st.env(freeAddr(t), "AUTH_CODES_PER_ADDR_PER_MIN", "2", "TRUSTED_PROXIES", proxy+",2001:db8::/32")
	a := newTestApp(t, env)
	// ask sends a code request from peer with the given headers.
	ask := func(peer string, header ...string) int {
		req := httptest.NewRequest("POST", "/auth/code", strings.NewReader(fmt.Sprintf(`{"phone": %q}`, apiPhone())))
		req.Header.Set("Content-Type", "application/json")
		req.RemoteAddr = net.JoinHostPort(peer, "40000")
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		rec := httptest.NewRecorder()
		a.router.ServeHTTP(rec, req)
		return rec.Code
	}
	tests := []struct {
		name string
		// req returns the i-th request's peer and headers.
		req  func(i int) (string, []string)
		want []int // statuses of three requests
	}{
		{
			"untrusted peer, a fresh X-Forwarded-For each time: ignored",
			func(int) (string, []string) { return "", []string{"X-Forwarded-For", clientAddr()} },
			[]int{200, 200, 429},
		},
		{
			"untrusted peer, a fresh X-Real-IP each time: ignored",
			func(int) (string, []string) { return "", []string{"X-Real-IP", clientAddr()} },
			[]int{200, 200, 429},
		},
		{
			"trusted proxy forwarding three clients: each counted alone",
			func(int) (string, []string) { return proxy, []string{"X-Forwarded-For", clientAddr()} },
			[]int{200, 200, 200},
		},
		{
			"proxy in a trusted CIDR forwarding three clients",
			func(int) (string, []string) { return "2001:db8::77", []string{"X-Forwarded-For", clientAddr()} },
			[]int{200, 200, 200},
		},
		{
			"trusted proxy forwarding one client that puts fresh addresses before its own",
			nil, // filled in below: the client's address is fixed
			[]int{200, 200, 429},
		},
		{
			"trusted proxy, X-Real-IP only: the proxy is the client",
			nil,
			[]int{200, 200, 429},
		},
	}
	client := clientAddr()
	tests[4].req = func(int) (string, []string) {
		return proxy, []string{"X-Forwarded-For", clientAddr() + ", " + client}
	}
	n := testenv.ID() // a /64 of its own: IPv6 addresses are counted per /64
	otherProxy := fmt.Sprintf("2001:db8:%x:%x::1", n>>16&0xffff, n&0xffff)
	tests[5].req = func(int) (string, []string) { return otherProxy, []string{"X-Real-IP", clientAddr()} }
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			peer := clientAddr() // an untrusted peer of this case's own
			var got []int
			for i := range tt.want {
				p, h := tt.req(i)
				if p == "" {
					p = peer
				}
				got = append(got, ask(p, h...))
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("statuses %v, want %v", got, tt.want)
			}
		})
	}
}

// TestAPILoginCodesNotLogged checks that a login code reaches the log only
// where it is shown anyway: the demo and AUTH_DEV_CODES=true.
func TestAPILoginCodesNotLogged(t *testing.T) {
	st := newStack(t, 0)
	tests := []struct {
		name   string
		env    map[string]string
		logged bool
	}{
		{"AUTH_DEV_CODES=false", st.env(freeAddr(t), "AUTH_DEV_CODES", "false"), false},
		{"AUTH_DEV_CODES unset", st.env(freeAddr(t), "AUTH_DEV_CODES", ""), false},
		{"AUTH_DEV_CODES=true", st.env(freeAddr(t), "AUTH_DEV_CODES", "true"), true},
		{"embedded demo", map[string]string{"HTTP_ADDR": freeAddr(t)}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := start(t, tt.env)
			phone := apiPhone()
			r := mustCall(t, "POST", in.Base+"/auth/code", "", map[string]string{"phone": phone})
			if r.Status != http.StatusOK || r.Body["sent"] != true {
				t.Fatalf("auth/code: %d %s", r.Status, r.Raw)
			}
			code := r.Str("code")
			if tt.logged != (code != "") {
				t.Fatalf("answer %s: the code is in it: %v, want %v", r.Raw, code != "", tt.logged)
			}
			if code == "" { // not shown: read it where the server keeps it
				var err error
				code, err = testenv.Redis(t, st.RedisDB).Eval(context.Background(), "return redis.call('ZRANGE', KEYS[1], -1, -1)[1]", []string{auth.CodeKey(phone)}).Text()
				if err != nil || len(code) != 6 {
					t.Fatalf("code of %s in Redis: %q, %v", phone, code, err)
				}
			}
			// Stopped, so that every line is written.
			if err := in.Stop(); err != nil {
				t.Fatal(err)
			}
			log := in.log.String()
			if got := strings.Contains(log, code); got != tt.logged {
				t.Errorf("the log holds the code %s: %v, want %v:\n%s", code, got, tt.logged, log)
			}
			if !strings.Contains(log, "login code") {
				t.Errorf("the log does not say a code was sent:\n%s", log)
			}
			if !tt.logged && strings.Contains(log, phone) {
				t.Errorf("the log holds the phone %s unmasked:\n%s", phone, log)
			}
		})
	}
}
