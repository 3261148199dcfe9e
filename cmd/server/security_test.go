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

// A few hundred anonymous connections from one address that send their
// headers and then one byte of their body (issue: they held every slot
// of MAX_IN_FLIGHT for the server's whole read timeout, and every buyer
// was told 429) leave buyers served: a slot is taken only once the body
// has arrived, and the address may hold only MAX_CONNS_PER_ADDR
// connections, the rest closed at once. /readyz counts those.
func TestSlowBodiesLeaveBuyersServed(t *testing.T) {
	st := newStack(t, 0)
	inst := start(t, st.env(freeAddr(t), "MAX_IN_FLIGHT", "64", "MAX_CONNS_PER_ADDR", "200"))
	admin, _ := mustLogin(t, inst.Base, adminPhone)
	vid := openVoucher(t, inst.Base, admin, 10)
	users := loginMany(t, inst.Base, 3)

	// The flood, from 127.0.0.2: another address than the buyers'
	// (127.0.0.1), on loopback all the same.
	host := strings.TrimPrefix(inst.Base, "http://")
	const flood = 300
	var conns []net.Conn
	var mu sync.Mutex
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	var wg sync.WaitGroup
	for range flood {
		wg.Go(func() {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 10 * time.Second}
			c, err := d.Dial("tcp", host)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			fmt.Fprintf(c, "POST /auth/code HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
		})
	}
	wg.Wait()
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
	if got, _ := r.Body["refused_connections"].(float64); got < flood-200 {
		t.Errorf("/readyz: %s; want at least %d refused connections (the flood past MAX_CONNS_PER_ADDR=200)", r.Raw, flood-200)
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
