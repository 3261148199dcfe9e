package auth

import (
	"context"
	_ "embed"
	"fmt"
	"net/netip"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/apperr"
)

// A 6-digit code is a small secret: one guess in a million. What keeps an
// account safe is how many guesses anyone gets, and what keeps the SMS bill
// sane is how many codes anyone can have sent. Limits holds both, and every
// count lives in Redis, so that all instances share it: a limit per
// instance would be multiplied by the number of instances.

// Limits bound how often login codes are sent and guessed.
type Limits struct {
	// CodeInterval is the least time between two codes to one phone;
	// 0 turns this limit off.
	CodeInterval time.Duration
	// CodesPerDay is how many codes one phone is sent in a day (24 hours
	// from its first code); 0 turns this limit off.
	CodesPerDay int
	// CodesPerAddrPerMin is how many code requests one client address
	// makes in a minute (from its first); 0 turns this limit off.
	CodesPerAddrPerMin int
	// GuessesPerCode is the wrong guesses that burn a code: after them
	// even the right code fails, and a new one must be asked for.
	GuessesPerCode int
	// GuessesPerDay is the wrong guesses one phone gets in a day (24
	// hours from its first), whatever codes they were made on; the one
	// that reaches it locks the phone for LockFor.
	GuessesPerDay int
	// LockFor is how long a phone stays locked: no code is sent to it and
	// no code logs it in, not even the right one.
	LockFor time.Duration
}

// DefaultLimits: a code a minute and ten a day
// per phone, twenty requests a minute per address, five wrong guesses per
// code and ten per day per phone, then a lock of fifteen minutes. With
// them a guesser gets ten guesses on a phone in a day, then one per new
// code (the lock burns it), and ten codes a day: at most about twenty
// guesses a day, which take some 35,000 days to reach an even chance of
// guessing a code they never see. Without them, "ask for a code, guess
// five times" took an account in about 200,000 rounds.
var DefaultLimits = Limits{
	CodeInterval:       time.Minute,
	CodesPerDay:        10,
	CodesPerAddrPerMin: 20,
	GuessesPerCode:     5,
	GuessesPerDay:      10,
	LockFor:            15 * time.Minute,
}

const (
	// codeTTL is how long a code logs in: the contract's five minutes.
	codeTTL = 5 * time.Minute
	day     = 24 * time.Hour
	// addrWindow is the window of CodesPerAddrPerMin.
	addrWindow = time.Minute
)

// The refusals of the limits. Each is busy (429), and comes wrapped with
// apperr.RetryAfter: how long until the refused request may succeed, from
// the TTL of the window or lock that refused it.
var (
	// ErrCodeTooSoon: a code was sent to this phone less than
	// CodeInterval ago.
	ErrCodeTooSoon = apperr.New(apperr.Busy, "a login code was sent to this phone moments ago; use it, or ask again after Retry-After seconds")
	// ErrTooManyCodes: the phone had CodesPerDay codes today.
	ErrTooManyCodes = apperr.New(apperr.Busy, "too many login codes for this phone today; ask again after Retry-After seconds")
	// ErrAddrBusy: the client address made CodesPerAddrPerMin requests
	// this minute.
	ErrAddrBusy = apperr.New(apperr.Busy, "too many login code requests from your address; ask again after Retry-After seconds")
	// ErrPhoneLocked: the phone had GuessesPerDay wrong guesses today.
	ErrPhoneLocked = apperr.New(apperr.Busy, "too many wrong login codes for this phone; it is locked, try again after Retry-After seconds")
)

// Answers of send_code.lua.
const (
	sendSent    = 0
	sendTooSoon = 1
	sendTooMany = 2
	sendLocked  = 3
)

// Answers of check_code.lua.
const (
	checkMatched = 0
	checkWrong   = 1
	checkLocked  = 2
)

var (
	//go:embed send_code.lua
	sendCodeSrc    string
	sendCodeScript = redis.NewScript(sendCodeSrc)

	//go:embed check_code.lua
	checkCodeSrc    string
	checkCodeScript = redis.NewScript(checkCodeSrc)

	//go:embed count_addr.lua
	countAddrSrc    string
	countAddrScript = redis.NewScript(countAddrSrc)
)

// phoneKeys are the Redis keys of one phone's login. They share the hash
// tag {phone}: in Redis Cluster they hash to one slot, which is what lets
// one script read and write them all.
type phoneKeys struct {
	code   string // hash: code, tries
	wait   string // exists while another code must wait (CodeInterval)
	sent   string // codes sent in the current day
	misses string // wrong guesses in the current day
	locked string // exists while the phone is locked
}

func keysOf(phone string) phoneKeys {
	p := "login:{" + phone + "}:"
	return phoneKeys{code: p + "code", wait: p + "wait", sent: p + "sent", misses: p + "misses", locked: p + "locked"}
}

// CodeKey is the Redis key of phone's current login code: a hash with
// the code and its count of wrong guesses. Tests read the code there when
// the server shows it nowhere else (AUTH_DEV_CODES=false).
func CodeKey(phone string) string { return keysOf(phone).code }

// addrKey is the key counting one client address's code requests. An
// IPv6 client usually holds a whole /64 (and can pick any address in
// it), so IPv6 addresses are counted per /64: else one client could ask
// from 2^64 "addresses". An IPv4 address (mapped into IPv6 or not) is
// counted alone. What is not an address at all (a Unix socket) shares one
// count.
func addrKey(addr string) string {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return "login:addr:unknown"
	}
	a = a.Unmap().WithZone("")
	if a.Is6() {
		p, _ := a.Prefix(64)
		return "login:addr:" + p.String()
	}
	return "login:addr:" + a.String()
}

// admitAddr counts a code request from addr, refusing it with
// ErrAddrBusy once the address is over its limit.
func (s *Service) admitAddr(ctx context.Context, addr string) error {
	if s.limits.CodesPerAddrPerMin <= 0 {
		return nil
	}
	wait, err := countAddrScript.Run(ctx, s.rdb, []string{addrKey(addr)}, s.limits.CodesPerAddrPerMin, addrWindow.Milliseconds()).Int64()
	if err != nil {
		return apperr.Down(fmt.Errorf("count login code requests of %s: %w", addr, err))
	}
	if wait > 0 {
		return apperr.RetryAfter(ErrAddrBusy, time.Duration(wait)*time.Millisecond)
	}
	return nil
}

// storeCode stores code as phone's new code if the phone's limits allow.
func (s *Service) storeCode(ctx context.Context, phone, code string) error {
	k := keysOf(phone)
	res, err := sendCodeScript.Run(ctx, s.rdb, []string{k.code, k.wait, k.sent, k.locked},
		code, codeTTL.Milliseconds(), s.limits.CodeInterval.Milliseconds(), s.limits.CodesPerDay, day.Milliseconds()).Int64Slice()
	if err != nil {
		return apperr.Down(fmt.Errorf("store login code: %w", err))
	}
	if len(res) != 2 {
		return fmt.Errorf("store login code: script answered %v", res)
	}
	wait := time.Duration(res[1]) * time.Millisecond
	switch res[0] {
	case sendSent:
		return nil
	case sendTooSoon:
		return apperr.RetryAfter(ErrCodeTooSoon, wait)
	case sendTooMany:
		return apperr.RetryAfter(ErrTooManyCodes, wait)
	case sendLocked:
		return apperr.RetryAfter(ErrPhoneLocked, wait)
	}
	return fmt.Errorf("store login code: script answered %v", res)
}

// checkCode checks code against phone's code, counting a wrong guess.
func (s *Service) checkCode(ctx context.Context, phone, code string) error {
	k := keysOf(phone)
	res, err := checkCodeScript.Run(ctx, s.rdb, []string{k.code, k.misses, k.locked},
		code, s.limits.GuessesPerCode, s.limits.GuessesPerDay, s.limits.LockFor.Milliseconds(), day.Milliseconds()).Int64Slice()
	if err != nil {
		return apperr.Down(fmt.Errorf("check login code: %w", err))
	}
	if len(res) != 2 {
		return fmt.Errorf("check login code: script answered %v", res)
	}
	switch res[0] {
	case checkMatched:
		return nil
	case checkWrong:
		return ErrWrongCode
	case checkLocked:
		return apperr.RetryAfter(ErrPhoneLocked, time.Duration(res[1])*time.Millisecond)
	}
	return fmt.Errorf("check login code: script answered %v", res)
}
