package web

import "net/netip"

// AddrKey is the client address addr as the limits count it (the login
// limits of package auth, the shares of package admission). An IPv6
// client usually holds a whole /64 and can pick any address in it, so an
// IPv6 address counts as its /64: else one client could be 2^64
// "addresses". An IPv4 address (mapped into IPv6 or not) counts alone.
// What is not an address at all (a Unix socket) shares one key.
func AddrKey(addr string) string {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return "unknown"
	}
	return AddrKeyOf(a)
}

// AddrKeyOf is AddrKey of an address already parsed.
func AddrKeyOf(a netip.Addr) string {
	a = a.Unmap().WithZone("")
	if a.Is6() {
		p, _ := a.Prefix(64)
		return p.String()
	}
	return a.String()
}
