package admission

import (
	"io"
	"net"
	"net/netip"
	"testing"
	"time"
)

// An address past its cap has its new connection closed at once; closing
// one of its own frees a place; a trusted proxy is not capped.
func TestConnsPerAddress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cs := NewConns(2, 0, []netip.Prefix{netip.MustParsePrefix("127.0.0.3/32")})
	capped := cs.Listener(ln)
	defer capped.Close()
	accepted := acceptAll(capped)
	dial := func(from string) net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		c, err := d.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// closed reports whether the server closed c (EOF) rather than
	// keeping it open (the read times out).
	closed := func(c net.Conn) bool {
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err := c.Read(make([]byte, 1))
		return err == io.EOF
	}

	a1, a2 := dial("127.0.0.2"), dial("127.0.0.2")
	s1, s2 := <-accepted, <-accepted
	a3 := dial("127.0.0.2")
	if !closed(a3) {
		t.Fatal("a third connection from an address capped at 2 stayed open")
	}
	if cs.Refused() != 1 {
		t.Fatalf("Refused = %d, want 1", cs.Refused())
	}
	b := dial("127.0.0.4") // another address has places of its own
	sb := <-accepted
	for range 3 {
		dial("127.0.0.3") // the trusted proxy
		<-accepted
	}
	s1.Close()
	a1.Close()
	a4 := dial("127.0.0.2")
	select {
	case s4 := <-accepted:
		s4.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("a closed connection did not give its place back")
	}
	_, _, _, _ = a2, s2, b, sb
	a4.Close()
}

// TRUSTED_PROXIES' entries as prefixes: addresses, ranges, and an IPv4
// range written in IPv6, which peers (compared unmapped) must match.
func TestParsePrefixes(t *testing.T) {
	got, err := ParsePrefixes([]string{"10.0.0.1", "172.28.0.0/24", "::ffff:192.168.0.0/112", "2001:db8::/32"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		addr string
		in   bool
	}{
		{"10.0.0.1", true}, {"10.0.0.2", false}, {"172.28.0.10", true}, {"192.168.3.4", true},
		{"192.169.0.1", false}, {"2001:db8::1", true}, {"2001:db9::1", false},
	} {
		a := netip.MustParseAddr(tt.addr)
		in := false
		for _, p := range got {
			in = in || p.Contains(a)
		}
		if in != tt.in {
			t.Errorf("%s trusted = %v, want %v (prefixes %v)", tt.addr, in, tt.in, got)
		}
	}
	if _, err := ParsePrefixes([]string{"not an address"}); err == nil {
		t.Error("a malformed entry was accepted")
	}
}

// acceptAll accepts ln's connections until it is closed, handing each on.
func acceptAll(ln net.Listener) <-chan net.Conn {
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	return accepted
}
