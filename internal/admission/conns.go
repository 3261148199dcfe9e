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
// The proxies in TRUSTED_PROXIES are not capped: every client behind one
// comes through its connections (their share of the slots is counted by
// the address the proxy names, in Cap).
type Conns struct {
	perAddr int
	trusted []netip.Prefix

	mu   sync.Mutex
	open map[string]int // by web.AddrKey

	refused atomic.Int64
}

// NewConns returns a cap of perAddr connections per address (0: none),
// not counting the addresses in trusted.
func NewConns(perAddr int, trusted []netip.Prefix) *Conns {
	return &Conns{perAddr: perAddr, trusted: trusted, open: map[string]int{}}
}

// Refused is how many connections the cap has closed.
func (cs *Conns) Refused() int64 { return cs.refused.Load() }

// Listener wraps ln: its Accept returns only the connections within the
// cap, and closing one gives its place back.
func (cs *Conns) Listener(ln net.Listener) net.Listener {
	if cs.perAddr <= 0 {
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
		key, ok := l.cs.admit(c.RemoteAddr())
		if ok {
			return &conn{Conn: c, cs: l.cs, key: key}, nil
		}
		l.cs.refused.Add(1)
		c.Close()
	}
}

// admit counts a new connection from addr, if its address is within the
// cap; key "" is a connection not counted (a trusted proxy's).
func (cs *Conns) admit(addr net.Addr) (key string, ok bool) {
	ap, err := netip.ParseAddrPort(addr.String())
	if err != nil {
		return "", true // not an IP connection: nothing to count it by
	}
	ip := ap.Addr().Unmap()
	for _, p := range cs.trusted {
		if p.Contains(ip) {
			return "", true
		}
	}
	key = web.AddrKey(ip.String())
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.open[key] >= cs.perAddr {
		return "", false
	}
	cs.open[key]++
	return key, true
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
	once sync.Once
}

func (c *conn) Close() error {
	c.once.Do(func() {
		if c.key == "" {
			return
		}
		c.cs.mu.Lock()
		defer c.cs.mu.Unlock()
		if c.cs.open[c.key] <= 1 {
			delete(c.cs.open, c.key)
		} else {
			c.cs.open[c.key]--
		}
	})
	return c.Conn.Close()
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
