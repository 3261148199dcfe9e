package auth_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gin-gonic/gin"

	"seckill/internal/apperr"
	"seckill/internal/auth"
	"seckill/internal/testenv"
	"seckill/internal/web"
)

// FuzzAuthBodies posts any body to POST /auth/code (login false) or POST
// /auth/login (login true), through the real handlers and service, in
// front of a Redis that is down: a body the handler takes reaches Redis
// and is answered 503 unavailable, which is how the target tells "taken"
// from "refused" without a server. It asserts: never a panic, never
// another 5xx; 400 invalid_argument in the envelope for every body that is
// not one JSON object of the shape, whose phone is not 11 digits starting
// with 1, or (login) whose code is not 6 digits; and only valid bodies get
// as far as Redis.
func FuzzAuthBodies(f *testing.F) {
	for _, seed := range []struct {
		login bool
		body  string
	}{
		{false, `{"phone":"13800000000"}`},
		{false, `{"phone":"13800000000","extra":1}`},
		{false, `{"phone":"1380000000"}`},
		{false, `{"phone":"138000000000"}`},
		{false, `{"phone":"23800000000"}`},
		{false, `{"phone":"13800000000\n"}`},
		{false, `{"phone":"+8613800000000"}`},
		{false, `{"phone":"１3800000000"}`},
		{false, `{"phone":13800000000}`},
		{false, `{"phone":null}`},
		{false, `{}`},
		{false, `null`},
		{false, `{"phone":"13800000000"} {}`},
		{false, ``},
		{true, `{"phone":"13800000000","code":"123456"}`},
		{true, `{"phone":"13800000000","code":"12345"}`},
		{true, `{"phone":"13800000000","code":"1234567"}`},
		{true, `{"phone":"13800000000","code":"12345a"}`},
		{true, `{"phone":"13800000000","code":123456}`},
		{true, `{"phone":"13800000000","code":"123456\n"}`},
		{true, `{"code":"123456"}`},
		{true, `{"phone":"13800000000","code":"123456","phone":"x"}`},
		{true, `[{"phone":"13800000000","code":"123456"}]`},
	} {
		f.Add(seed.login, []byte(seed.body))
	}
	gin.SetMode(gin.TestMode)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	rdb := testenv.DownRedis(f)
	sender := &countingSender{}
	svc := auth.NewService(nil, rdb, tokensAt(testKey, issuedAt), nil, sender, auth.DefaultLimits)
	r := gin.New()
	r.Use(web.Recover(log), web.ReadBody(web.BodyTimeout, web.MaxBody))
	h := auth.NewHandler(svc, false, log)
	r.POST("/auth/code", h.SendCode)
	r.POST("/auth/login", h.Login)

	f.Fuzz(func(t *testing.T, login bool, body []byte) {
		path := "/auth/code"
		if login {
			path = "/auth/login"
		}
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		r.ServeHTTP(rec, req)

		// Each endpoint's body has its own shape: a "code" is no field of
		// POST /auth/code's, and ignored there like any unknown field.
		var valid bool
		if login {
			var in struct {
				Phone string `json:"phone"`
				Code  string `json:"code"`
			}
			valid = json.Unmarshal(body, &in) == nil && isPhone(in.Phone) && isCode(in.Code)
		} else {
			var in struct {
				Phone string `json:"phone"`
			}
			valid = json.Unmarshal(body, &in) == nil && isPhone(in.Phone)
		}
		var env struct {
			Error struct {
				Code    apperr.Code `json:"code"`
				Message string      `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &env); err != nil || env.Error.Message == "" {
			t.Fatalf("answered %d %s to %s %q: not the envelope (%v)", rec.Code, rec.Body, path, body, err)
		}
		switch {
		case valid && rec.Code == http.StatusServiceUnavailable && env.Error.Code == apperr.Unavailable:
		case !valid && rec.Code == http.StatusBadRequest && env.Error.Code == apperr.InvalidArgument:
		case !valid && rec.Code == http.StatusRequestEntityTooLarge && len(body) > web.MaxBody:
		default:
			t.Fatalf("answered %d %s to %s %q (valid: %t)", rec.Code, rec.Body, path, body, valid)
		}
		if n := sender.n; n != 0 {
			t.Fatalf("%d codes sent without Redis", n)
		}
	})
}

// isPhone is the contract's phone number written out the long way: 11
// ASCII digits, the first a 1.
func isPhone(s string) bool { return len(s) == 11 && s[0] == '1' && digits(s) }

// isCode is the contract's login code: 6 ASCII digits.
func isCode(s string) bool { return len(s) == 6 && digits(s) }

func digits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

type countingSender struct{ n int }

func (s *countingSender) Send(context.Context, string, string) error { s.n++; return nil }
