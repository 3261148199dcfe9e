package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// A few hundred anonymous connections that send their headers and then
// one byte of their body (issue 22: they held every slot of MAX_IN_FLIGHT
// for the server's whole read timeout, and every buyer was told 429)
// leave buyers served: a slot is taken only once the body has arrived.
// They come from eight addresses, so that the fair share of the slots
// alone could not save the buyers (eight addresses fill them). A ninth
// address opens more connections than MAX_CONNS_PER_ADDR: the rest are
// closed at once, and /readyz counts them.
func TestSlowBodiesLeaveBuyersServed(t *testing.T) {
	st := newStack(t, 0)
	inst := start(t, st.env(freeAddr(t), "MAX_IN_FLIGHT", "64", "MAX_CONNS_PER_ADDR", "50"))
	admin, _ := mustLogin(t, inst.Base, adminPhone)
	vid := openVoucher(t, inst.Base, admin, 10)
	users := loginMany(t, inst.Base, 3)

	host := strings.TrimPrefix(inst.Base, "http://")
	var mu sync.Mutex
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	// open opens n connections from 127.0.0.<last> (loopback all the
	// same: another address than the buyers' 127.0.0.1) and sends each
	// what it is given.
	open := func(last byte, n int, send string) {
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, last)}, Timeout: 10 * time.Second}
				c, err := d.Dial("tcp", host)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				conns = append(conns, c)
				mu.Unlock()
				fmt.Fprint(c, send)
			})
		}
		wg.Wait()
	}
	const perAddr, flooders = 40, 8
	for a := range flooders {
		open(byte(2+a), perAddr, "POST /auth/code HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
	}
	open(10, 80, "") // idle: past MAX_CONNS_PER_ADDR=50
	// Give the server time to read the flood's headers: on the old
	// main, each then held a slot.
	time.Sleep(time.Second)

	for _, u := range users {
		a := rawBuy(inst.Base, u.Token, vid)
		if a.Err != nil {
			t.Fatal(a.Err)
		}
		if a.Status != http.StatusOK {
			t.Errorf("a buyer during the flood: %d %s, want 200", a.Status, a.Message)
		}
		if a.Took > 5*time.Second {
			t.Errorf("a buyer during the flood waited %s", a.Took)
		}
	}
	r := mustCall(t, "GET", inst.Base+"/readyz", "", nil)
	if r.Status != http.StatusOK {
		t.Fatalf("/readyz: %d %s", r.Status, r.Raw)
	}
	if got, _ := r.Body["refused_connections"].(float64); got != 30 {
		t.Errorf("/readyz: %s; want 30 refused connections (80 from one address, MAX_CONNS_PER_ADDR=50)", r.Raw)
	}
	if got, _ := r.Body["in_flight"].(float64); got > 1 {
		t.Errorf("/readyz: %s; the slow bodies hold slots", r.Raw)
	}
	if _, ok := r.Body["saturated"].(bool); !ok {
		t.Errorf("/readyz does not say whether it is saturated: %s", r.Raw)
	}
}

// Every answer carries the security headers, and a request with two
// Authorization headers is refused; the demo's Redis counts its TTLs down
// as the clock does (a login code's interval ends: before, miniredis kept
// every key for good, and the first refusal never ended).
func TestEmbeddedHeadersAndExpiry(t *testing.T) {
	in := start(t, map[string]string{"HTTP_ADDR": freeAddr(t), "AUTH_CODE_INTERVAL": "1s"})
	for _, path := range []string{"/healthz", "/nowhere", "/live/1"} {
		resp, err := http.Get(in.Base + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		for k, v := range map[string]string{"X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer"} {
			if got := resp.Header.Get(k); got != v {
				t.Errorf("GET %s (%d): %s = %q, want %q", path, resp.StatusCode, k, got, v)
			}
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "frame-ancestors 'none'") {
			t.Errorf("GET %s: Content-Security-Policy %q has no frame-ancestors 'none'", path, csp)
		}
	}

	token, _ := mustLogin(t, in.Base, "13912345670")
	req, _ := http.NewRequest("GET", in.Base+"/orders/1", nil)
	req.Header.Add("Authorization", "Bearer "+token)
	req.Header.Add("Authorization", "Bearer not-a-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var body struct{ Error struct{ Code string } }
	json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || body.Error.Code != "invalid_argument" {
		t.Errorf("two Authorization headers: %d %+v, want 400 invalid_argument", resp.StatusCode, body)
	}

	phone := "13912345671"
	ask := func() int {
		return mustCall(t, "POST", in.Base+"/auth/code", "", map[string]string{"phone": phone}).Status
	}
	if got := ask(); got != http.StatusOK {
		t.Fatalf("first code: %d", got)
	}
	if got := ask(); got != http.StatusTooManyRequests {
		t.Fatalf("a second code at once: %d, want 429 (AUTH_CODE_INTERVAL=1s)", got)
	}
	// The interval is a second; the demo's clock is checked for as long
	// as ten.
	deadline := time.Now().Add(10 * time.Second)
	for ask() != http.StatusOK {
		if time.Now().After(deadline) {
			t.Fatal("the demo's code interval of 1s never ended: its Redis keeps TTLs for good")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// A server started on a port already taken fails naming HTTP_ADDR, before
// it announces a demo voucher that nobody could buy.
func TestTakenPortFailsFirst(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var out syncBuffer
	err = run(t.Context(), func(k string) string {
		return map[string]string{"HTTP_ADDR": ln.Addr().String()}[k]
	}, &out)
	if err == nil || !strings.Contains(err.Error(), "HTTP_ADDR "+ln.Addr().String()) {
		t.Fatalf("run on a taken port: %v, want an error naming HTTP_ADDR", err)
	}
	if strings.Contains(out.String(), "demo voucher on sale") {
		t.Errorf("the demo voucher was announced before the port failed:\n%s", out.String())
	}
}

// With a development setting on, a host name that resolves beyond
// loopback is refused once bound, whatever devVars could tell from the
// name.
func TestDevSettingsCheckedOnTheBoundAddress(t *testing.T) {
	cfg := config{HTTPAddr: "127.0.0.1:0", DevSettings: []string{"AUTH_DEV_CODES"}}
	if err := checkBound(cfg, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 80}); err != nil {
		t.Errorf("loopback refused: %v", err)
	}
	if err := checkBound(cfg, &net.TCPAddr{IP: net.IPv4(10, 0, 0, 5), Port: 80}); err == nil {
		t.Error("10.0.0.5 accepted with AUTH_DEV_CODES on")
	}
	cfg.DevOnNetwork = true
	if err := checkBound(cfg, &net.TCPAddr{IP: net.IPv4(10, 0, 0, 5), Port: 80}); err != nil {
		t.Errorf("10.0.0.5 refused with ALLOW_DEV_SETTINGS_ON_NETWORK: %v", err)
	}
}
