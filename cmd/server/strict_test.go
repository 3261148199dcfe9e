package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"seckill/internal/payment"
)

// Strict where it is cheap (issue 35, probe findings I3 and I5).

// post sends body to url under the Content-Type ct ("" for none, and
// body nil for no body), with token if any and the header's pairs.
func post(t *testing.T, url, token, ct string, body []byte, header ...string) reply {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest("POST", url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := reply{Status: resp.StatusCode, Header: resp.Header, Raw: string(raw)}
	json.Unmarshal(raw, &r.Body)
	return r
}

// Every route that reads a JSON body reads it only as application/json:
// under text/plain (what a page of another site may post from its
// visitors' browsers without asking first), a form, or no type at all,
// it answers 415 unsupported_media_type and does nothing. The routes
// that take no body work without a Content-Type, and the fake payment
// provider's webhook calls still pay.
func TestAPIJSONOnly(t *testing.T) {
	st := newStack(t, 0)
	in := start(t, st.env(freeAddr(t), "LIVE_CROWD", "true", "PAYMENT_FAKE", "true"))
	admin, _ := mustLogin(t, in.Base, adminPhone)
	vid := createVoucher(t, in.Base, admin, 2, time.Now().Add(-time.Minute), time.Now().Add(time.Hour), "price", 100)
	codeOf := func(phone string) string {
		r := mustCall(t, "POST", in.Base+"/auth/code", "", map[string]string{"phone": phone})
		return r.Str("code")
	}
	login := []byte(`{"phone":"13900000095","code":"` + codeOf("13900000095") + `"}`)
	voucher := []byte(`{"title":"x","stock":1,"begin_time":"` + time.Now().UTC().Format(time.RFC3339) + `","end_time":"` + time.Now().Add(time.Hour).UTC().Format(time.RFC3339) + `"}`)
	event := payment.Event{ID: "evt_json_only", OrderID: 1, Amount: 100}.Body()
	signed := []string{payment.Header, payment.Sign([]byte(testPaySecret), event, time.Now())}

	routes := []struct {
		path, token string
		body        []byte
		header      []string
	}{
		{"/auth/code", "", []byte(`{"phone":"13900000094"}`), nil},
		{"/auth/login", "", login, nil},
		{"/vouchers", admin, voucher, nil},
		{"/admin/dead-letters/replay", admin, []byte(`{"all":true}`), nil},
		{"/payments/webhook", "", event, signed},
		{"/live/" + vid + "/crowd", admin, []byte(`{"users":1,"rate":1}`), nil},
	}
	for _, ct := range []string{"text/plain;charset=UTF-8", "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", ""} {
		for _, rt := range routes {
			if r := post(t, in.Base+rt.path, rt.token, ct, rt.body, rt.header...); r.Status != http.StatusUnsupportedMediaType || r.Code() != "unsupported_media_type" {
				t.Errorf("POST %s as %q: %d %s, want 415 unsupported_media_type", rt.path, ct, r.Status, r.Raw)
			}
		}
	}
	// Nothing was done: the login code still logs in, as JSON.
	if r := post(t, in.Base+"/auth/login", "", "Application/JSON; charset=utf-8", login); r.Status != http.StatusOK {
		t.Errorf("the login code, as JSON after the refusals: %d %s", r.Status, r.Raw)
	}

	// No body, no Content-Type: the buy button, paying (the fake provider
	// calls the webhook, as JSON), refunding, cancelling, logging out.
	payer, _ := mustLogin(t, in.Base, "13900000093")
	canceller, _ := mustLogin(t, in.Base, "13900000092")
	orderOf := func(tok string) string {
		t.Helper()
		r := post(t, in.Base+"/seckill/"+vid, tok, "", nil)
		if r.Status != http.StatusOK {
			t.Fatalf("POST /seckill without a Content-Type: %d %s", r.Status, r.Raw)
		}
		return "/orders/" + r.Str("order_id")
	}
	paid, cancelled := orderOf(payer), orderOf(canceller)
	if r := post(t, in.Base+paid+"/pay", payer, "", nil); r.Status != http.StatusAccepted {
		t.Fatalf("POST %s/pay without a Content-Type: %d %s", paid, r.Status, r.Raw)
	}
	waitFor(t, 10*time.Second, "the fake provider's webhook call", func() bool {
		return mustCall(t, "GET", in.Base+paid, payer, nil).Str("status") == "paid"
	})
	for _, c := range []struct{ path, token string }{{paid + "/refund", payer}, {cancelled + "/cancel", canceller}, {"/auth/logout", payer}} {
		if r := post(t, in.Base+c.path, c.token, "", nil); r.Status != http.StatusOK {
			t.Errorf("POST %s without a Content-Type: %d %s", c.path, r.Status, r.Raw)
		}
	}
}

// A token signed with the server's own key, but with a claim of the
// wrong JSON type or spelling, is refused like a forged one: 401.
func TestAPIStrictClaims(t *testing.T) {
	in := start(t, newStack(t, 0).env(freeAddr(t)))
	_, id := mustLogin(t, in.Base, "13900000091")
	now := time.Now()
	good := jwt.MapClaims{"sub": id, "role": "user", "iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}
	sign := func(change ...any) string {
		c := jwt.MapClaims{}
		for k, v := range good {
			c[k] = v
		}
		for i := 0; i+1 < len(change); i += 2 {
			c[change[i].(string)] = change[i+1]
		}
		s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString([]byte(testSecret))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	for _, tt := range []struct {
		name   string
		token  string
		status int
	}{
		{"as issued", sign(), http.StatusNotFound},
		{"exp a numeric string", sign("exp", strconv.FormatInt(now.Add(time.Hour).Unix(), 10)), http.StatusUnauthorized},
		{"iat a numeric string", sign("iat", strconv.FormatInt(now.Unix(), 10)), http.StatusUnauthorized},
		{"nbf a numeric string", sign("nbf", strconv.FormatInt(now.Add(-time.Minute).Unix(), 10)), http.StatusUnauthorized},
		{"sub a number", sign("sub", json.Number(id)), http.StatusUnauthorized},
		{"sub with a plus sign", sign("sub", "+"+id), http.StatusUnauthorized},
		{"sub with a leading zero", sign("sub", "0"+id), http.StatusUnauthorized},
	} {
		if r := mustCall(t, "GET", in.Base+"/orders/1", tt.token, nil); r.Status != tt.status {
			t.Errorf("%s: GET /orders/1 = %d %s, want %d", tt.name, r.Status, r.Raw, tt.status)
		}
	}
}
