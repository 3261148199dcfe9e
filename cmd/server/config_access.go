package main

// Who gets in: the areas of loadConfig for logging in, admission, the
// development settings and what differs between the demo and the real
// stack.

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"seckill/internal/auth"
	"seckill/internal/payment"
)

// loginVars reads how long a token lasts and the login codes' limits.
// What differs between the demo and the real stack is read by stackVars.
func loginVars(c *config, v *vars) {
	c.TokenTTL = v.dur("TOKEN_TTL", 2*time.Hour)
	// A stolen token is worth something until it expires, and a logout
	// everywhere is kept in Redis for as long as a token can live.
	if c.TokenTTL > auth.MaxTTL {
		v.errorf("TOKEN_TTL must be at most %gh (it is %s): a stolen token works until it expires, and a logout everywhere is remembered only that long", auth.MaxTTL.Hours(), c.TokenTTL)
	}
	// Login codes. The limits that only cost SMS and Redis can be turned
	// off with 0 (tests and load tests log thousands of users in from one
	// address); the guess limits cannot: without them a 6-digit code is
	// guessed in a day.
	lim := auth.DefaultLimits
	if c.embedded() {
		// The demo listens on loopback only (devVars), where every client
		// is this machine's: a load test's users are all logged in from
		// one address (docs/tutorial.md, "Load it").
		lim.CodesPerAddrPerMin = 0
	}
	c.AuthLimits = auth.Limits{
		CodeInterval:       v.offOrSeconds("AUTH_CODE_INTERVAL", lim.CodeInterval),
		CodesPerDay:        v.limit("AUTH_CODES_PER_DAY", lim.CodesPerDay),
		CodesPerAddrPerMin: v.limit("AUTH_CODES_PER_ADDR_PER_MIN", lim.CodesPerAddrPerMin),
		FreeGuesses:        v.int("AUTH_FREE_GUESSES", lim.FreeGuesses, 0, 1000),
		MaxGuessDelay:      v.dur("AUTH_MAX_GUESS_DELAY", lim.MaxGuessDelay),
		FreeGuessesPerAddr: v.int("AUTH_FREE_GUESSES_PER_ADDR", lim.FreeGuessesPerAddr, 0, 100_000),
		MaxAddrDelay:       v.dur("AUTH_MAX_ADDR_DELAY", lim.MaxAddrDelay),
		// OWASP ASVS 2.2.1: no more than 100 failed attempts an hour on
		// one account.
		PhoneGuessesPerHour: v.int("AUTH_PHONE_GUESSES_PER_HOUR", lim.PhoneGuessesPerHour, 1, 100),
		AttackGuessesPerMin: v.int("AUTH_ATTACK_GUESSES_PER_MIN", lim.AttackGuessesPerMin, 1, maxLimit),
		TrustFor:            v.dur("AUTH_TRUST_FOR", lim.TrustFor),
	}
	// The waits start at a second and double: a longest wait under a
	// second could not be told in Retry-After's whole seconds, and one
	// over a day would be the lock these waits replace.
	for _, d := range []struct {
		name string
		d    time.Duration
	}{{"AUTH_MAX_GUESS_DELAY", c.AuthLimits.MaxGuessDelay}, {"AUTH_MAX_ADDR_DELAY", c.AuthLimits.MaxAddrDelay}} {
		if d.d > 0 && (d.d < time.Second || d.d > 24*time.Hour) {
			v.errorf("%s must be from 1s to 24h (it is %s)", d.name, d.d)
		}
	}
	if t := c.AuthLimits.TrustFor; t > 0 && t < time.Minute {
		v.errorf("AUTH_TRUST_FOR must be at least 1m (it is %s): a login from an address trusts it for that long", t)
	}
	// The phone's lock is gone (a stranger could lock the owner out):
	// a server still given its settings says so rather than ignore them.
	for _, old := range retiredVars {
		if v.getenv(old) != "" {
			v.errorf("%s is no longer read: a phone is not locked after wrong codes any more; the client address that guesses waits instead (AUTH_FREE_GUESSES, AUTH_MAX_GUESS_DELAY, AUTH_FREE_GUESSES_PER_ADDR, AUTH_MAX_ADDR_DELAY, AUTH_PHONE_GUESSES_PER_HOUR; see docs/upgrading.md)", old)
		}
	}
}

// retiredVars are the settings of the phone's lock, which is gone: a
// server given one refuses to start (loginVars). docs/upgrading.md lists
// them, and TestConfigurationDocumented keeps them out of
// docs/configuration.md.
var retiredVars = []string{"AUTH_GUESSES_PER_CODE", "AUTH_GUESSES_PER_DAY", "AUTH_LOCK_FOR"}

// admissionVars reads what lets a request in: the buy button's per-user
// rate, how many requests one instance works on at once, and which
// proxies may name a client's address.
func admissionVars(c *config, v *vars) {
	c.SeckillRate = v.rate("SECKILL_RATE", 10)
	c.SeckillBurst = v.int("SECKILL_BURST", 20, 1, 1_000_000)
	// By default four requests per Redis connection: a request holds one
	// only for its round trips, and beyond a few per connection they wait
	// for one (go-redis' pool timeout) instead of working.
	c.MaxInFlight = v.int("MAX_IN_FLIGHT", 4*c.RedisPoolSize, 0, 1_000_000)
	c.TrustedProxies = v.list("TRUSTED_PROXIES", "")
	for _, p := range c.TrustedProxies {
		v.add(checkProxy(p))
	}
	// Far more than a browser opens (six) or a load test needs from one
	// machine, far less than the process' open files.
	c.MaxConnsPerAddr = v.int("MAX_CONNS_PER_ADDR", 1024, 0, 1_000_000)
	// An IPv6 /48 is one site (a home's or an office's network, often),
	// and holds 65,536 /64s: capped only per /64, one site could open
	// 65,536 times MAX_CONNS_PER_ADDR. Four addresses' worth: room for a
	// site's hundreds of browsers, and a bound on what it costs.
	c.MaxConnsPer48 = v.int("MAX_CONNS_PER_IPV6_48", 4096, 0, 1_000_000)
}

// devVars keeps the development settings off the network. Each hands a
// client what it should have earned: AUTH_DEV_CODES any phone's login
// code (the admin's too, so admin), LIVE_CROWD tokens of made-up users
// and a crowd that buys, PAYMENT_FAKE a paid order without payment. On
// loopback only the machine's own users reach them; on a network
// address, everyone who reaches the port does. So with any of them on:
//
//   - HTTP_ADDR without a host (":8080", the default) listens on
//     127.0.0.1 only, and run says so;
//   - HTTP_ADDR with a host that is not loopback is refused at start;
//
// unless ALLOW_DEV_SETTINGS_ON_NETWORK=true says that every client that
// can reach the address is trusted (the compose file's private network,
// behind its proxy published on 127.0.0.1).
func devVars(c *config, v *vars) {
	for _, s := range []struct {
		name string
		on   bool
	}{{"AUTH_DEV_CODES", c.DevCodes}, {"LIVE_CROWD", c.LiveCrowd}, {"PAYMENT_FAKE", c.PaymentFake}} {
		if s.on {
			c.DevSettings = append(c.DevSettings, s.name)
		}
	}
	c.DevOnNetwork = v.bool("ALLOW_DEV_SETTINGS_ON_NETWORK", false)
	if len(c.DevSettings) == 0 || c.DevOnNetwork {
		return
	}
	host, port, err := net.SplitHostPort(c.HTTPAddr)
	switch {
	case err != nil:
		v.errorf("HTTP_ADDR %q is not host:port (or :port)", c.HTTPAddr)
	case host == "":
		c.LoopbackFrom = c.HTTPAddr
		c.HTTPAddr = net.JoinHostPort("127.0.0.1", port)
	case !loopback(host):
		v.errorf("%s on HTTP_ADDR %q, which is not loopback: anyone who reaches it could use them (AUTH_DEV_CODES answers the admin's login code). Turn them off, listen on 127.0.0.1, or set ALLOW_DEV_SETTINGS_ON_NETWORK=true if every client that reaches %s is yours",
			strings.Join(c.DevSettings, ", "), c.HTTPAddr, c.HTTPAddr)
	}
}

// loopback reports whether host names this machine's loopback only.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// stackVars reads what differs between the embedded demo (neither
// MYSQL_DSN nor Redis set) and the real stack (both set): who logs in as
// admin, whether login codes are answered, the live page's crowd, and the
// key tokens are signed with. One of MYSQL_DSN and Redis without the
// other is refused.
func stackVars(c *config, v *vars) {
	switch {
	case c.embedded():
		c.AdminPhones = v.list("ADMIN_PHONES", "13800000000")
		c.DevCodes = v.bool("AUTH_DEV_CODES", true)
		c.LiveCrowd = v.bool("LIVE_CROWD", true)
		c.PaymentFake = v.bool("PAYMENT_FAKE", true)
		c.JWTSecret = []byte(v.getenv("JWT_SECRET"))
		if len(c.JWTSecret) == 0 {
			c.JWTSecret = make([]byte, 32)
			rand.Read(c.JWTSecret)
		}
		c.PaymentSecret = []byte(v.getenv("PAYMENT_WEBHOOK_SECRET"))
		if len(c.PaymentSecret) == 0 {
			c.PaymentSecret = make([]byte, 32)
			rand.Read(c.PaymentSecret)
		}
	case c.MySQLDSN == "" || len(c.Redis.Addrs) == 0:
		v.add(errors.New("set both MYSQL_DSN and REDIS_ADDR (or REDIS_ADDRS) for the real stack, or neither for the embedded demo"))
	default:
		c.AdminPhones = v.list("ADMIN_PHONES", "")
		c.DevCodes = v.bool("AUTH_DEV_CODES", false)
		c.LiveCrowd = v.bool("LIVE_CROWD", false)
		c.PaymentFake = v.bool("PAYMENT_FAKE", false)
		c.JWTSecret = []byte(v.getenv("JWT_SECRET"))
		// HS256 signs with HMAC-SHA256, whose key must be at least as long
		// as the hash's 32 bytes (RFC 7518, section 3.2): a shorter one is
		// guessed sooner, and anyone who guesses it mints admin tokens.
		// Spaces around it are not counted: 32 blanks are no secret.
		if n := len(bytes.TrimSpace(c.JWTSecret)); n < minJWTSecret {
			v.errorf("JWT_SECRET must be set (%d bytes or more, not counting spaces around it; it has %d) outside the demo (MYSQL_DSN and REDIS_ADDR or REDIS_ADDRS set); for example: export JWT_SECRET=$(openssl rand -hex 32)", minJWTSecret, n)
		}
		// The webhook's key: whoever holds it can declare any order paid.
		c.PaymentSecret = []byte(v.getenv("PAYMENT_WEBHOOK_SECRET"))
		if n := len(bytes.TrimSpace(c.PaymentSecret)); n < payment.MinSecret {
			v.errorf("PAYMENT_WEBHOOK_SECRET must be set (%d bytes or more, not counting spaces around it; it has %d) outside the demo: the payment provider signs its webhook calls with it; for example: export PAYMENT_WEBHOOK_SECRET=$(openssl rand -hex 32)", payment.MinSecret, n)
		}
	}
}

// checkProxy checks one entry of TRUSTED_PROXIES: an IP address or a CIDR,
// as gin's SetTrustedProxies takes them, and not one that covers every
// address or a wide part of them: trusting every peer's X-Forwarded-For lets each client name its
// own address, which is gin's default and the hole this setting closes.
func checkProxy(p string) error {
	if strings.Contains(p, "/") {
		prefix, err := netip.ParsePrefix(p)
		if err != nil {
			return fmt.Errorf("TRUSTED_PROXIES: %q is neither an IP address nor a CIDR such as 10.0.0.0/8", p)
		}
		// gin (net.IPNet) matches an IPv4 peer against an IPv4-mapped
		// prefix as against the IPv4 prefix of its last 32 bits: to it,
		// ::ffff:0:0/96 is 0.0.0.0/0.
		bits := prefix.Bits()
		if prefix.Addr().Is4In6() && bits >= 96 {
			bits -= 96
		}
		if bits == 0 {
			return fmt.Errorf("TRUSTED_PROXIES: %q trusts every peer, so that any client could name its own address; list your proxies' addresses", p)
		}
		// Wider networks are refused too: no tier of proxies is that big,
		// and two of them (0.0.0.0/1 and 128.0.0.0/1) trust every peer as
		// surely as one /0. In IPv6 a /16 is already vast; only the private
		// range fc00::/7 may be named whole.
		v4 := prefix.Addr().Unmap().Is4()
		private := netip.MustParsePrefix("fc00::/7")
		switch {
		case v4 && bits < 8:
			return fmt.Errorf("TRUSTED_PROXIES: %q is wider than /8: a few such entries trust every peer; list your proxies' addresses", p)
		case !v4 && bits < 16 && !(bits >= 7 && private.Contains(prefix.Addr())):
			return fmt.Errorf("TRUSTED_PROXIES: %q is wider than /16 (only fc00::/7, the private range, may be wider): a few such entries trust every peer; list your proxies' addresses", p)
		}
		return nil
	}
	if a, err := netip.ParseAddr(p); err != nil || a.Zone() != "" {
		return fmt.Errorf("TRUSTED_PROXIES: %q is neither an IP address nor a CIDR such as 10.0.0.0/8", p)
	}
	return nil
}
