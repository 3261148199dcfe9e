package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
	"github.com/gin-gonic/gin"

	"seckill/api"
)

// The tests here hold the server to api/openapi.yaml: the routes it
// serves are the routes documented, and its answers, errors included,
// match the documented bodies, statuses and headers.

// openAPI returns the document as package api serves it.
func openAPI(t *testing.T) *openapi3.T {
	t.Helper()
	r := gin.New()
	r.GET("/openapi.yaml", api.Serve)
	rec := httptest.NewRecorder()
	r.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/openapi.yaml", nil))
	doc, err := openapi3.NewLoader().LoadFromData(rec.Body.Bytes())
	if err != nil {
		t.Fatalf("parse openapi.yaml: %v", err)
	}
	return doc
}

// TestOpenAPIRoutes checks the router the server really builds (routes.go,
// here on the embedded stores: the routes are the same in every mode)
// against the document, both ways.
func TestOpenAPIRoutes(t *testing.T) {
	env := map[string]string{"HTTP_ADDR": "127.0.0.1:0"}
	a := newTestApp(t, env)

	param := regexp.MustCompile(`[:*]([A-Za-z0-9_]+)`)
	var served []string
	for _, rt := range a.router.Routes() {
		served = append(served, rt.Method+" "+param.ReplaceAllString(rt.Path, "{$1}"))
	}
	var documented []string
	for path, item := range openAPI(t).Paths.Map() {
		for method := range item.Operations() {
			documented = append(documented, method+" "+path)
		}
	}
	slices.Sort(served)
	slices.Sort(documented)

	for _, rt := range served {
		if !slices.Contains(documented, rt) {
			t.Errorf("the server serves %s, which api/openapi.yaml does not document", rt)
		}
	}
	for _, op := range documented {
		if slices.Contains(served, op) {
			continue
		}
		t.Errorf("api/openapi.yaml documents %s, which the server does not serve", op)
	}
}

// contract sends requests to a server and checks each answer against the
// document.
type contract struct {
	t      *testing.T
	base   string
	router routers.Router
}

// exchange sends a request and validates the answer against the
// document: its status must be one the operation documents, and its
// headers and body must match that response. validRequest also validates
// the request itself (left out for the requests that are wrong on
// purpose). body may be nil, a string (sent as is) or a value (as JSON).
func (c contract) exchange(method, path, token string, body any, header map[string]string, validRequest bool) (int, http.Header, map[string]any) {
	t := c.t
	t.Helper()
	var raw []byte
	switch b := body.(type) {
	case nil:
	case string:
		raw = []byte(b)
	default:
		raw, _ = json.Marshal(b)
	}
	req, err := http.NewRequest(method, c.base+path, bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}

	route, params, err := c.router.FindRoute(req)
	if err != nil {
		t.Fatalf("%s %s is not in api/openapi.yaml: %v", method, path, err)
	}
	opts := &openapi3filter.Options{
		IncludeResponseStatus: true, // an undocumented status fails
		MultiError:            true,
		AuthenticationFunc:    openapi3filter.NoopAuthenticationFunc,
	}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route, Options: opts}
	if validRequest {
		if err := openapi3filter.ValidateRequest(context.Background(), in); err != nil {
			t.Errorf("%s %s: the request does not match api/openapi.yaml: %v", method, path, err)
		}
		req.Body = io.NopCloser(bytes.NewReader(raw)) // validation read it
	}

	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	err = openapi3filter.ValidateResponse(context.Background(), &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in,
		Status:                 resp.StatusCode,
		Header:                 resp.Header,
		Body:                   io.NopCloser(bytes.NewReader(got)),
		Options:                opts,
	})
	if err != nil {
		t.Errorf("%s %s: answer %d %s does not match api/openapi.yaml: %v", method, path, resp.StatusCode, got, err)
	}
	var decoded map[string]any
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(got, &decoded); err != nil {
			t.Errorf("%s %s: answer %q is not JSON", method, path, got)
		}
	}
	return resp.StatusCode, resp.Header, decoded
}

// expect is exchange for a request that must answer status (and, for an
// error, code); it returns the body.
func (c contract) expect(status int, code, method, path, token string, body any, header map[string]string, validRequest bool) (http.Header, map[string]any) {
	c.t.Helper()
	got, h, b := c.exchange(method, path, token, body, header, validRequest)
	e, _ := b["error"].(map[string]any)
	if got != status || (code != "" && e["code"] != code) {
		c.t.Errorf("%s %s: %d %v, want %d %s", method, path, got, b, status, code)
	}
	return h, b
}

// TestOpenAPIResponses drives a real server (MySQL, Redis database 9)
// through every route, the usual answers and the errors, and validates
// each answer against api/openapi.yaml with kin-openapi.
func TestOpenAPIResponses(t *testing.T) {
	st := newStack(t, 9)
	in := start(t, st.env(freeAddr(t),
		"AUTH_CODE_INTERVAL", "", // the default minute: a second code is 429
		"SECKILL_BURST", "2", "SECKILL_RATE", "0.01", // a third click is 429
	))
	doc := openAPI(t)
	router, err := legacy.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	c := contract{t: t, base: in.Base, router: router}
	const valid, invalid = true, false
	str := func(m map[string]any, k string) string { s, _ := m[k].(string); return s }

	c.expect(200, "", "GET", "/healthz", "", nil, nil, valid)
	c.expect(200, "", "GET", "/readyz", "", nil, nil, valid)

	// Logging in; a second code within the minute is refused with Retry-After.
	login := func(phone string) (string, string) {
		t.Helper()
		_, b := c.expect(200, "", "POST", "/auth/code", "", map[string]string{"phone": phone}, nil, valid)
		_, b = c.expect(200, "", "POST", "/auth/login", "", map[string]string{"phone": phone, "code": str(b, "code")}, nil, valid)
		u, _ := b["user"].(map[string]any)
		return str(b, "token"), str(u, "id")
	}
	admin, _ := login(adminPhone)
	alice, _ := login("13900000001")
	bob, _ := login("13900000002")
	h, _ := c.expect(429, "busy", "POST", "/auth/code", "", map[string]string{"phone": adminPhone}, nil, valid)
	if h.Get("Retry-After") == "" {
		t.Error("429 of POST /auth/code without Retry-After")
	}
	c.expect(401, "unauthorized", "POST", "/auth/login", "", map[string]string{"phone": "13900000001", "code": "000000"}, nil, valid)
	c.expect(400, "invalid_argument", "POST", "/auth/code", "", map[string]string{"phone": "12345"}, nil, invalid)
	c.expect(413, "invalid_argument", "POST", "/auth/code", "", `{"phone": "`+strings.Repeat("1", 1<<20)+`"}`, nil, invalid)
	c.expect(415, "unsupported_media_type", "POST", "/auth/code", "", map[string]string{"phone": "13900000001"}, map[string]string{"Content-Type": "text/plain"}, invalid)

	// Vouchers.
	newVoucher := map[string]any{
		"title": "openapi", "stock": 1,
		"begin_time": time.Now().Add(-time.Minute).UTC().Format(time.RFC3339),
		"end_time":   time.Now().Add(time.Hour).UTC().Format(time.RFC3339),
	}
	once := map[string]string{"Idempotency-Key": "openapi-test"}
	_, v := c.expect(201, "", "POST", "/vouchers", admin, newVoucher, once, valid)
	voucherID := str(v, "id")
	h, _ = c.expect(429, "busy", "POST", "/vouchers", admin, newVoucher, once, valid)
	if ra := h.Get("Retry-After"); ra != "" {
		t.Errorf("429 of a repeated Idempotency-Key has Retry-After %q; docs/api.md says it has none", ra)
	}
	c.expect(403, "forbidden", "POST", "/vouchers", alice, newVoucher, nil, valid)
	c.expect(401, "unauthorized", "POST", "/vouchers", "", newVoucher, nil, invalid)
	c.expect(400, "invalid_argument", "POST", "/vouchers", admin, `{"title": "broken",`, nil, invalid)
	later := map[string]any{
		"title": "later", "stock": 5,
		"begin_time": time.Now().Add(24 * time.Hour).UTC().Format(time.RFC3339),
		"end_time":   time.Now().Add(48 * time.Hour).UTC().Format(time.RFC3339),
	}
	_, lv := c.expect(201, "", "POST", "/vouchers", admin, later, nil, valid)
	c.expect(200, "", "GET", "/vouchers/"+voucherID, "", nil, nil, valid)
	c.expect(400, "invalid_argument", "GET", "/vouchers/abc", "", nil, nil, invalid)
	c.expect(404, "not_found", "GET", "/vouchers/999999999999", "", nil, nil, valid)
	_, page := c.expect(200, "", "GET", "/vouchers?limit=1", "", nil, nil, valid)
	c.expect(200, "", "GET", "/vouchers?before="+str(page, "next_before"), "", nil, nil, valid)
	c.expect(200, "", "GET", "/vouchers", "", nil, nil, valid)
	c.expect(400, "invalid_argument", "GET", "/vouchers?limit=0", "", nil, nil, invalid)

	// The sale: one unit, two buyers, and a third click over the bucket.
	_, o := c.expect(200, "", "POST", "/seckill/"+voucherID, alice, nil, nil, valid)
	orderID := str(o, "order_id")
	c.expect(409, "already_ordered", "POST", "/seckill/"+voucherID, alice, nil, nil, valid)
	h, _ = c.expect(429, "busy", "POST", "/seckill/"+voucherID, alice, nil, nil, valid)
	if h.Get("Retry-After") == "" {
		t.Error("429 of the token bucket without Retry-After")
	}
	c.expect(409, "sold_out", "POST", "/seckill/"+voucherID, bob, nil, nil, valid)
	c.expect(409, "not_started", "POST", "/seckill/"+str(lv, "id"), bob, nil, nil, valid)
	c.expect(401, "unauthorized", "POST", "/seckill/"+voucherID, "", nil, nil, invalid)
	c.expect(404, "not_found", "POST", "/seckill/999999999999", admin, nil, nil, valid)

	// Orders: the owner and an admin see it, anyone else does not.
	c.expect(200, "", "GET", "/orders/"+orderID, alice, nil, nil, valid)
	c.expect(200, "", "GET", "/orders/"+orderID, admin, nil, nil, valid)
	c.expect(404, "not_found", "GET", "/orders/"+orderID, bob, nil, nil, valid)

	// Admin.
	c.expect(200, "", "GET", "/admin/queue", admin, nil, nil, valid)
	c.expect(403, "forbidden", "GET", "/admin/queue", alice, nil, nil, valid)
	c.expect(200, "", "GET", "/admin/dead-letters", admin, nil, nil, valid)
	c.expect(400, "invalid_argument", "POST", "/admin/dead-letters/replay", admin, map[string]any{}, nil, invalid)
	// Replay queues orders for a consumer, which only async mode runs.
	c.expect(400, "invalid_argument", "POST", "/admin/dead-letters/replay", admin, map[string]any{"all": true}, nil, valid)
	async := contract{t: t, base: start(t, st.env(freeAddr(t), "SECKILL_MODE", "async")).Base, router: router}
	async.expect(200, "", "POST", "/admin/dead-letters/replay", admin, map[string]any{"all": true}, nil, valid)
	_, r := async.expect(200, "", "POST", "/admin/dead-letters/replay", admin, map[string]any{"ids": []string{"1:1-0"}}, nil, valid)
	if rs, _ := r["replayed"].([]any); len(rs) != 1 {
		t.Errorf("replay of one unknown ID: %v", r)
	}

	// The simulated crowd, on a server that has it: started, then refused
	// while it runs (one user at one press a second: two seconds), and a
	// crowd of no one refused.
	crowd := contract{t: t, base: start(t, st.env(freeAddr(t), "LIVE_CROWD", "true")).Base, router: router}
	crowd.expect(202, "", "POST", "/live/"+voucherID+"/crowd", admin, map[string]int{"users": 1, "rate": 1}, nil, valid)
	crowd.expect(429, "busy", "POST", "/live/"+voucherID+"/crowd", admin, nil, nil, valid)
	crowd.expect(400, "invalid_argument", "POST", "/live/"+voucherID+"/crowd", admin, map[string]int{"users": 0}, nil, invalid)
	c.expect(403, "forbidden", "POST", "/live/"+voucherID+"/crowd", admin, nil, nil, valid)

	// Logging out everywhere, last: bob's token is void from here on.
	c.expect(200, "", "POST", "/auth/logout", bob, nil, nil, valid)
	c.expect(401, "unauthorized", "POST", "/auth/logout", "", nil, nil, invalid)

	// The document itself.
	h, _ = c.expect(200, "", "GET", "/openapi.yaml", "", nil, nil, valid)
	if ct := h.Get("Content-Type"); ct != "application/yaml" {
		t.Errorf("GET /openapi.yaml: Content-Type %q", ct)
	}
}
