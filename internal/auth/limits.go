package auth

import (
	"context"
	"crypto/rand"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/apperr"
	"seckill/internal/web"
)

// A 6-digit code is a small secret: one guess in a million. What keeps an
// account safe is how many guesses anyone gets, and what keeps the SMS bill
// sane is how many codes anyone can have sent. Limits holds both, and every
// count lives in Redis, so that all instances share it: a limit per
// instance would be multiplied by the number of instances.
//
// A limit is also a weapon: whatever a guesser can make the server refuse,
// a stranger can make it refuse to the phone's owner. An earlier version
// counted wrong guesses per phone and locked the phone after ten: anyone
// who knew the admin's number could keep the admin out all day. So no
// refusal here is the phone's alone:
//
//   - a client address that guesses wrong on a phone waits, longer after
//     each wrong guess (the pair: this phone, this address); only that
//     address waits, and its login clears the count;
//   - an address that guesses wrong on many phones waits too (the
//     address, over all phones);
//   - the phone caps the wrong guesses of an hour, but only from addresses
//     it never logged in from: an address that logged in to the phone is
//     trusted for a while, and neither counted nor refused there;
//   - when wrong guesses pour in everywhere (an attack), the free guesses
//     are gone, for everyone but trusted pairs.
//
// And a code does not replace the one before: a stranger asking for codes
// adds codes on the owner's phone, and cannot undo the one being typed in.

// Limits bound how often login codes are sent and guessed.
type Limits struct {
	// CodeInterval is the least time between two codes to one phone;
	// 0 turns this limit off.
	CodeInterval time.Duration
	// CodesPerDay is how many codes one phone is sent in a day (24 hours
	// from its first code), on requests from addresses it never logged in
	// from (a trusted pair is not counted, nor refused); 0 turns this
	// limit off.
	CodesPerDay int
	// CodesPerAddrPerMin is how many code requests one client address
	// makes in a minute (from its first); 0 turns this limit off.
	CodesPerAddrPerMin int
	// FreeGuesses is how many wrong guesses one client address makes on
	// one phone before it waits: then each further wrong guess makes it
	// wait twice as long as the last, from a second up to MaxGuessDelay.
	// A login from the address clears the count.
	FreeGuesses int
	// MaxGuessDelay is the longest that wait grows to.
	MaxGuessDelay time.Duration
	// FreeGuessesPerAddr is the same for one client address over all
	// phones: its wrong guesses before it waits, then a second, doubling
	// up to MaxAddrDelay. Logins from the address do not clear it.
	FreeGuessesPerAddr int
	// MaxAddrDelay is the longest an address waits.
	MaxAddrDelay time.Duration
	// PhoneGuessesPerHour is how many wrong guesses one phone takes in
	// any hour from addresses it is not trusted from; past it they are
	// refused until the oldest is an hour old. Trusted pairs are neither
	// counted nor refused.
	PhoneGuessesPerHour int
	// AttackGuessesPerMin is how many wrong guesses, over all phones and
	// addresses, make a minute look like an attack: from then until the
	// minute ends, pairs and addresses without trust get no free guesses.
	AttackGuessesPerMin int
	// TrustFor is how long a login makes its pair (phone, address)
	// trusted.
	TrustFor time.Duration
}

// DefaultLimits: a code a minute per phone and ten a day from strangers;
// twenty code requests a minute per address; three free wrong guesses
// per phone and address, then waits of 1 s, 2 s, 4 s ... up to 15
// minutes; ten free wrong guesses per address over all phones, then waits
// up to an hour; twenty wrong guesses an hour per phone from addresses it
// never logged in from; no free guesses while over 1,000 wrong guesses a
// minute fail everywhere; trust for 30 days after a login.
//
// What they allow: one address gets about twenty guesses in its first
// hour, on one phone or spread over many, then one an hour: some 45 in
// its first day, 24 a day after. Many addresses together get twenty an
// hour on a phone, and since a code lives five minutes, each code meets
// at most twenty of them: one chance in 50,000. Ten codes a day from
// strangers, and the owner's own, keep that near one chance in 3,000 a
// day for an attacker with a botnet (who also wakes the owner with ten
// codes a day). OWASP ASVS 2.2.1 allows up to 100 failures an hour on an
// account; twenty costs the owner nothing, since their own addresses
// are not counted.
var DefaultLimits = Limits{
	CodeInterval:        time.Minute,
	CodesPerDay:         10,
	CodesPerAddrPerMin:  20,
	FreeGuesses:         3,
	MaxGuessDelay:       15 * time.Minute,
	FreeGuessesPerAddr:  10,
	MaxAddrDelay:        time.Hour,
	PhoneGuessesPerHour: 20,
	AttackGuessesPerMin: 1000,
	TrustFor:            30 * 24 * time.Hour,
}

const (
	// codeTTL is how long a code logs in: the contract's five minutes.
	codeTTL = 5 * time.Minute
	// liveCodes is how many codes a phone keeps at once, the oldest
	// dropped first. Five, because a code a minute (CodeInterval) for
	// five minutes (codeTTL) makes five: no code goes before it expires,
	// so asking for codes cannot push out the one the owner received.
	liveCodes = 5
	day       = 24 * time.Hour
	hour      = time.Hour
	// addrWindow is the window of CodesPerAddrPerMin.
	addrWindow = time.Minute
	// attackWindow is the window of AttackGuessesPerMin.
	attackWindow = time.Minute
	// firstDelay is the first wait after the free guesses; each further
	// wrong guess doubles it.
	firstDelay = time.Second
	// forgetAfter is how long a count of wrong guesses (a pair's, an
	// address's) is kept after its wait ends. A guesser who waits out
	// each delay meets the next, longer one; a client quiet for an hour
	// starts over, its typos forgotten.
	forgetAfter = time.Hour
)

// The refusals of the limits. Each is busy (429), and comes wrapped with
// apperr.RetryAfter: how long until the refused request may succeed, read
// from Redis' clock.
var (
	// ErrCodeTooSoon: a code was sent to this phone less than
	// CodeInterval ago.
	ErrCodeTooSoon = apperr.New(apperr.Busy, "a login code was sent to this phone moments ago; use it, or ask again after Retry-After seconds")
	// ErrTooManyCodes: the phone had CodesPerDay codes today.
	ErrTooManyCodes = apperr.New(apperr.Busy, "too many login codes for this phone today; ask again after Retry-After seconds")
	// ErrAddrBusy: the client address made CodesPerAddrPerMin requests
	// this minute.
	ErrAddrBusy = apperr.New(apperr.Busy, "too many login code requests from your address; ask again after Retry-After seconds")
	// ErrGuessTooSoon: this address guessed wrong on this phone moments
	// ago, past its free guesses.
	ErrGuessTooSoon = apperr.New(apperr.Busy, "too many wrong login codes for this phone from your address; try again after Retry-After seconds")
	// ErrAddrGuessTooSoon: this address guessed wrong on many phones.
	ErrAddrGuessTooSoon = apperr.New(apperr.Busy, "too many wrong login codes from your address; try again after Retry-After seconds")
	// ErrAddrAtOnce: this address has as many login attempts in flight
	// as it may (see admit_guess.lua).
	ErrAddrAtOnce = apperr.New(apperr.Busy, "too many logins at once from your address; try again after Retry-After seconds")
	// ErrPhoneGuessedOut: the phone had PhoneGuessesPerHour wrong guesses
	// in the last hour from addresses it never logged in from.
	ErrPhoneGuessedOut = apperr.New(apperr.Busy, "too many wrong login codes for this phone from new addresses; try again after Retry-After seconds, or from an address you logged in from before")
)

// Answers of send_code.lua.
const (
	sendSent    = 0
	sendTooSoon = 1
	sendTooMany = 2
)

// Answers of check_code.lua.
const (
	checkMatched   = 0
	checkWrong     = 1
	checkPairWait  = 2
	checkPhoneBusy = 3
)

var (
	//go:embed send_code.lua
	sendCodeSrc    string
	sendCodeScript = redis.NewScript(sendCodeSrc)

	// wait.lua is the wait of wrong guesses, shared by the scripts that
	// count them or gate on them: each begins with it.
	//go:embed wait.lua
	waitSrc string

	//go:embed check_code.lua
	checkCodeSrc    string
	checkCodeScript = redis.NewScript(waitSrc + checkCodeSrc)

	//go:embed count_window.lua
	countWindowSrc    string
	countWindowScript = redis.NewScript(countWindowSrc)

	//go:embed admit_guess.lua
	admitGuessSrc    string
	admitGuessScript = redis.NewScript(waitSrc + admitGuessSrc)

	//go:embed settle_guess.lua
	settleGuessSrc    string
	settleGuessScript = redis.NewScript(waitSrc + settleGuessSrc)
)

// Answers of admit_guess.lua.
const (
	admitted    = 0
	admitWait   = 1
	admitAtOnce = 2
)

const (
	// attemptFor is how long an attempt counts as in flight at most: one
	// whose instance died before settling it is then forgotten.
	attemptFor = 30 * time.Second
	// settleFor bounds the counting after a comparison (the attempt's
	// settling, the minute's count), which runs even when the client has
	// gone: a wrong guess whose client hung up must count. (It bounds the
	// wait for a connection; a read is bounded by the client's own
	// ReadTimeout.)
	settleFor = 2 * time.Second
)

// phoneKeys are the Redis keys of one phone's login, as seen from one
// client address. They share the hash tag {phone}: in Redis Cluster they
// hash to one slot, which is what lets one script read and write them
// all. The address's own keys (addrKeys) and the global count live in
// other slots, so they have scripts of their own.
type phoneKeys struct {
	codes  string // sorted set: the live codes, scored by expiry (ms)
	wait   string // exists while another code must wait (CodeInterval)
	sent   string // codes sent in the current day, to strangers
	failed string // sorted set: the last hour's wrong guesses from strangers
	pair   string // hash: n, until: this address's wrong guesses here
	trust  string // exists while this address is trusted for this phone
}

func keysOf(phone, addr string) phoneKeys {
	p := "login:{" + phone + "}:"
	a := web.AddrKey(addr)
	return phoneKeys{
		codes: p + "codes", wait: p + "wait", sent: p + "sent", failed: p + "failed",
		pair: p + "pair:" + a, trust: p + "trust:" + a,
	}
}

// CodeKey is the Redis key of phone's live login codes: a sorted set of
// codes scored by the time each expires (ms, Redis' clock), the newest
// last. Tests read the code there when the server shows it nowhere else
// (AUTH_DEV_CODES=false).
func CodeKey(phone string) string { return keysOf(phone, "").codes }

// addrKey is the key counting one client address's code requests;
// addrGuessKeys the two counting its wrong guesses (a hash: n, until) and
// its attempts in flight (a sorted set), which share the address's hash
// tag: one script reads and writes both. An IPv6 address counts as its
// /64 (web.AddrKey): a client can pick any address in it.
func addrKey(addr string) string { return "login:addr:" + web.AddrKey(addr) }
func addrGuessKeys(addr string) []string {
	p := "login:addr:{" + web.AddrKey(addr) + "}:"
	return []string{p + "failed", p + "inflight"}
}

// failedKey counts the wrong guesses of the current minute over all
// phones and addresses: the sign of an attack.
const failedKey = "login:failed"

// admitAddr counts a code request from addr, refusing it with
// ErrAddrBusy once the address is over its limit.
func (s *Service) admitAddr(ctx context.Context, addr string) error {
	if s.limits.CodesPerAddrPerMin <= 0 {
		return nil
	}
	wait, err := countWindowScript.Run(ctx, s.rdb, []string{addrKey(addr)}, s.limits.CodesPerAddrPerMin, addrWindow.Milliseconds()).Int64()
	if err != nil {
		return apperr.Down(fmt.Errorf("count login code requests of %s: %w", addr, err))
	}
	if wait > 0 {
		return apperr.RetryAfter(ErrAddrBusy, time.Duration(wait)*time.Millisecond)
	}
	return nil
}

// storeCode stores code as one of phone's live codes if the phone's
// limits allow; addr is the client's, trusted or not.
func (s *Service) storeCode(ctx context.Context, phone, addr, code string) error {
	k := keysOf(phone, addr)
	res, err := sendCodeScript.Run(ctx, s.rdb, []string{k.codes, k.wait, k.sent, k.trust},
		code, codeTTL.Milliseconds(), s.limits.CodeInterval.Milliseconds(), s.limits.CodesPerDay, day.Milliseconds(), liveCodes).Int64Slice()
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
	}
	return fmt.Errorf("store login code: script answered %v", res)
}

// checkCode checks code against phone's live codes for a client at addr,
// in up to four steps, each in its own Cluster slot:
//
//  1. read whether a minute of failures looks like an attack, and whether
//     the pair is trusted (one round trip);
//  2. unless trusted, admit the attempt at the address's gate: not while
//     the address waits, nor past the attempts it may have in flight
//     (admit_guess.lua);
//  3. check the code at the phone: the pair's wait, the phone's budget,
//     the comparison and the count, in one script;
//  4. settle the attempt at the address, counting it if it was a wrong
//     guess, and add a wrong guess to the minute's count.
func (s *Service) checkCode(ctx context.Context, phone, code, addr string) error {
	k := keysOf(phone, addr)
	var failed *redis.StringCmd
	var trust *redis.IntCmd
	// Pipelined answers the first command's error; each is looked at
	// below, where a missing count (redis.Nil) is no error.
	_, _ = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		failed = p.Get(ctx, failedKey)
		trust = p.Exists(ctx, k.trust)
		return nil
	})
	n, err := failed.Int()
	if errors.Is(err, redis.Nil) {
		n, err = 0, nil
	}
	if err == nil {
		err = trust.Err()
	}
	if err != nil {
		return apperr.Down(fmt.Errorf("read login guess counts: %w", err))
	}
	attack := 0
	if n >= s.limits.AttackGuessesPerMin {
		attack = 1
	}
	// The trusted pair skips the address's gate: an owner who shares an
	// address with a guesser (a carrier's NAT, an office) still logs in.
	// The script at the phone reads the trust again, as its own.
	attempt := ""
	if trust.Val() == 0 {
		attempt = rand.Text()
		res, err := admitGuessScript.Run(ctx, s.rdb, addrGuessKeys(addr),
			s.limits.FreeGuessesPerAddr, attack, attempt, attemptFor.Milliseconds()).Int64Slice()
		if err != nil {
			return apperr.Down(fmt.Errorf("admit a login of %s: %w", addr, err))
		}
		switch {
		case len(res) == 2 && res[0] == admitWait:
			return apperr.RetryAfter(ErrAddrGuessTooSoon, time.Duration(res[1])*time.Millisecond)
		case len(res) == 2 && res[0] == admitAtOnce:
			return apperr.RetryAfter(ErrAddrAtOnce, time.Duration(res[1])*time.Millisecond)
		case len(res) != 1 || res[0] != admitted:
			return fmt.Errorf("admit a login: script answered %v", res)
		}
	}

	res, err := checkCodeScript.Run(ctx, s.rdb, []string{k.codes, k.pair, k.trust, k.failed},
		code, s.limits.FreeGuesses, attack, firstDelay.Milliseconds(), s.limits.MaxGuessDelay.Milliseconds(),
		forgetAfter.Milliseconds(), s.limits.PhoneGuessesPerHour, hour.Milliseconds(), s.limits.TrustFor.Milliseconds()).Int64Slice()
	if s.afterCheck != nil {
		s.afterCheck()
	}
	// Whether the script ran is unknown when it failed: the address's
	// count then takes it as a wrong guess, erring on the side of
	// counting.
	wrong := err != nil || (len(res) == 2 && res[0] == checkWrong)
	// What follows the comparison is not on the request's context: a
	// client that hangs up once its guess was compared must not take the
	// counts (and the attempt's place in flight) away with it.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleFor)
	defer cancel()
	if attempt != "" {
		serr := settleGuessScript.Run(sctx, s.rdb, addrGuessKeys(addr), attempt, b2i(wrong), s.limits.FreeGuessesPerAddr, attack,
			firstDelay.Milliseconds(), s.limits.MaxAddrDelay.Milliseconds(), forgetAfter.Milliseconds()).Err()
		// A wrong guess the address did not count would be a guess for
		// free: refused. A login that matched stands (its code is
		// spent); its attempt is forgotten after attemptFor.
		if serr != nil && wrong && err == nil {
			return apperr.Down(fmt.Errorf("count a wrong login code of %s: %w", addr, serr))
		}
	}
	if err != nil {
		return apperr.Down(fmt.Errorf("check login code: %w", err))
	}
	if len(res) != 2 {
		return fmt.Errorf("check login code: script answered %v", res)
	}
	if wrong {
		// The count is read at the next login (step 1); the limit given
		// here only decides the script's answer, which nobody needs.
		if err := countWindowScript.Run(sctx, s.rdb, []string{failedKey}, s.limits.AttackGuessesPerMin, attackWindow.Milliseconds()).Err(); err != nil {
			return apperr.Down(fmt.Errorf("count a wrong login code: %w", err))
		}
		return ErrWrongCode
	}
	wait := time.Duration(res[1]) * time.Millisecond
	switch res[0] {
	case checkMatched:
		return nil
	case checkPairWait:
		return apperr.RetryAfter(ErrGuessTooSoon, wait)
	case checkPhoneBusy:
		return apperr.RetryAfter(ErrPhoneGuessedOut, wait)
	}
	return fmt.Errorf("check login code: script answered %v", res)
}

// b2i is 1 for true: a script's flag.
func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
