package admission

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"seckill/internal/web"
)

// Conns caps the connections one client address holds open at once. A
// connection that has sent nothing costs the server a goroutine, two
// buffers and a file descriptor until its read deadline; a few addresses
// opening thousands each would run the process out of descriptors, and
// then nobody connects. Beyond its cap an address's new connection is
// closed as soon as it is accepted, before any byte is read.
//
// An IPv6 address counts as its /64 (web.AddrKey), since a client can
// pick any address in it; but one network is often given a /48, which
// holds 65,536 /64s, each under a cap of its own. So all the connections
// from one /48 are capped too (perSite): without it, one /48 could open
// 65,536 times the per-address cap.
//
// The proxies in TRUSTED_PROXIES are not capped: every client behind one
// comes through its connections (their share of the slots is counted by
// the address the proxy names, in Cap).
type Conns struct {
	perAddr int
	perSite int // per IPv6 /48
	trusted []netip.Prefix

	mu    sync.Mutex
	open  map[string]int // by web.AddrKey
	sites map[string]int // by siteOf: IPv6 connections only

	refused atomic.Int64
}

// NewConns returns a cap of perAddr connections per address and perSite
// per IPv6 /48 (0: none), not counting the addresses in trusted.
func NewConns(perAddr, perSite int, trusted []netip.Prefix) *Conns {
	return &Conns{perAddr: perAddr, perSite: perSite, trusted: trusted, open: map[string]int{}, sites: map[string]int{}}
}

// Refused is how many connections the cap has closed.
func (cs *Conns) Refused() int64 { return cs.refused.Load() }

// Listener wraps ln: its Accept returns only the connections within the
// cap, and closing one gives its place back.
func (cs *Conns) Listener(ln net.Listener) net.Listener {
	if cs.perAddr <= 0 && cs.perSite <= 0 {
		return ln
	}
	return &capped{Listener: ln, cs: cs}
}

type capped struct {
	net.Listener
	cs *Conns
}

func (l *capped) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		key, site, ok := l.cs.admit(c.RemoteAddr())
		if ok {
			return &conn{Conn: c, cs: l.cs, key: key, site: site}, nil
		}
		l.cs.refused.Add(1)
		c.Close()
	}
}

// admit counts a new connection from addr, if its address and its /48
// are within their caps; key "" is a connection not counted (a trusted
// proxy's), site "" one not counted by /48 (an IPv4 one's).
func (cs *Conns) admit(addr net.Addr) (key, site string, ok bool) {
	ap, err := netip.ParseAddrPort(addr.String())
	if err != nil {
		return "", "", true // not an IP connection: nothing to count it by
	}
	ip := ap.Addr().Unmap()
	for _, p := range cs.trusted {
		if p.Contains(ip) {
			return "", "", true
		}
	}
	key, site = web.AddrKeyOf(ip), siteOf(ip)
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.perAddr > 0 && cs.open[key] >= cs.perAddr {
		return "", "", false
	}
	if site != "" && cs.perSite > 0 && cs.sites[site] >= cs.perSite {
		return "", "", false
	}
	cs.open[key]++
	if site != "" {
		cs.sites[site]++
	}
	return key, site, true
}

// siteOf is the IPv6 /48 that ip belongs to, "" for an IPv4 address or
// the loopback (one machine: its own tests and load tools, capped per
// address if at all): the block one network (a site) is commonly given,
// which a client holding it can fill with addresses of 65,536 /64s.
func siteOf(ip netip.Addr) string {
	ip = ip.Unmap().WithZone("")
	if !ip.Is6() || ip.IsLoopback() {
		return ""
	}
	p, _ := ip.Prefix(48)
	return p.String()
}

// sharesOf is the keys the cap on requests in flight shares its slots
// by (Cap): the site (an IPv6 /48, or an IPv4 address) and, within it,
// the address (web.AddrKey: an IPv6 /64). What is no IP address is a
// site and an address of its own.
func sharesOf(addr string) (site, key string) {
	ip, err := netip.ParseAddr(addr)
	switch {
	case err != nil:
		// A site of its own: not "" (IPv6 loopback's site, siteOf).
		return "?" + addr, "?" + addr
	case ip.Is4():
		return addr, addr // as parsed: ParseAddr takes only the canonical form of IPv4
	}
	ip = ip.Unmap().WithZone("")
	if ip.Is6() {
		return siteOf(ip), web.AddrKeyOf(ip)
	}
	s := ip.String()
	return s, s
}

// CloseWrite half-closes the connection when it can: net/http does so
// before closing a connection whose request it refused, so that the
// client reads the answer instead of a reset.
func (c *conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// conn gives its place back once, when it is closed.
type conn struct {
	net.Conn
	cs   *Conns
	key  string
	site string
	once sync.Once
}

func (c *conn) Close() error {
	c.once.Do(func() {
		if c.key == "" {
			return
		}
		c.cs.mu.Lock()
		defer c.cs.mu.Unlock()
		release(c.cs.open, c.key)
		if c.site != "" {
			release(c.cs.sites, c.site)
		}
	})
	return c.Conn.Close()
}

// release takes one off m[key], and forgets key at none: the maps hold
// the addresses with connections open only.
func release(m map[string]int, key string) {
	if m[key] <= 1 {
		delete(m, key)
	} else {
		m[key]--
	}
}

// ParsePrefixes reads TRUSTED_PROXIES' entries, addresses or CIDR ranges,
// as prefixes.
func ParsePrefixes(list []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range list {
		if p, err := netip.ParsePrefix(s); err == nil {
			// An IPv4 range written in IPv6 (::ffff:10.0.0.0/104) is
			// the IPv4 range: peers are compared unmapped.
			if p.Addr().Is4In6() && p.Bits() >= 96 {
				p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
			}
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, err
		}
		a = a.Unmap()
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}
