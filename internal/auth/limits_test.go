package auth

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"seckill/internal/apperr"
	"seckill/internal/testenv"
)

// These tests run the login code limits on the real Redis (and MySQL, for
// the logins that succeed), each on a phone and addresses of its own.

// recorder is a Sender that remembers the codes it was given.
type recorder struct {
	mu    sync.Mutex
	codes map[string][]string // phone -> codes, oldest first
}

func (r *recorder) Send(_ context.Context, phone, code string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.codes == nil {
		r.codes = map[string][]string{}
	}
	r.codes[phone] = append(r.codes[phone], code)
	return nil
}

func (r *recorder) sent(phone string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.codes[phone]...)
}

// newLimited returns a Service with limits on the test Redis and a fresh
// MySQL database, and the recorder its codes go to.
func newLimited(t *testing.T, limits Limits) (*Service, *recorder) {
	t.Helper()
	db := testenv.Open(t, testenv.MySQLDSN(t))
	rdb := testenv.Redis(t, 0)
	tokens := NewTokens([]byte("limits-test-key-0123456789abcdef"), time.Hour, rdb, time.Now)
	rec := &recorder{}
	return NewService(db, rdb, tokens, nil, rec, limits), rec
}

// testPhone returns a phone no other test uses, and deletes its keys
// (those of every address included) when the test ends.
func testPhone(t *testing.T, s *Service) string {
	t.Helper()
	phone := fmt.Sprintf("137%08d", testenv.ID()%100_000_000)
	t.Cleanup(func() {
		ctx := context.Background()
		keys, _ := s.rdb.Keys(ctx, "login:{"+phone+"}:*").Result()
		if len(keys) > 0 {
			s.rdb.Del(ctx, keys...)
		}
	})
	return phone
}

// testAddr returns an IPv4 address no other test uses, and deletes its
// counts when the test ends.
func testAddr(t *testing.T, s *Service) string {
	t.Helper()
	n := testenv.ID()
	addr := fmt.Sprintf("10.%d.%d.%d", n>>16&0xff, n>>8&0xff, n&0xff)
	t.Cleanup(func() { s.rdb.Del(context.Background(), append(addrGuessKeys(addr), addrKey(addr))...) })
	return addr
}

// mustSend asks for a code and returns it.
func mustSend(t *testing.T, s *Service, phone, addr string) string {
	t.Helper()
	code, err := s.SendCode(context.Background(), phone, addr)
	if err != nil {
		t.Fatalf("SendCode(%s): %v", phone, err)
	}
	return code
}

// wrongCode is a code that is none of codes: none of a phone's live
// codes, when given all that were sent to it.
func wrongCode(codes ...string) string {
	n, _ := strconv.Atoi(codes[0])
	for {
		n = (n + 1) % 1_000_000
		guess := fmt.Sprintf("%06d", n)
		if !slices.Contains(codes, guess) {
			return guess
		}
	}
}

// login logs in to phone with code from addr.
func login(s *Service, phone, code, addr string) error {
	_, _, err := s.Login(context.Background(), phone, code, addr)
	return err
}

// expectWrong checks that logging in with code from addr is refused as a
// wrong code (401), not by a limit.
func expectWrong(t *testing.T, s *Service, phone, code, addr string) {
	t.Helper()
	if err := login(s, phone, code, addr); !errors.Is(err, ErrWrongCode) {
		t.Fatalf("Login(%s, %s) from %s = %v, want ErrWrongCode", phone, code, addr, err)
	}
}

// expectLogin checks that code logs in to phone from addr.
func expectLogin(t *testing.T, s *Service, phone, code, addr string) {
	t.Helper()
	if err := login(s, phone, code, addr); err != nil {
		t.Fatalf("Login(%s, %s) from %s = %v, want a login", phone, code, addr, err)
	}
}

// expectRefused checks that err is want with a Retry-After hint in
// (lo, hi].
func expectRefused(t *testing.T, err, want error, lo, hi time.Duration) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("error %v, want %v", err, want)
	}
	if e := apperr.As(err); e == nil || e.Code != apperr.Busy {
		t.Errorf("error %v is not busy (429)", err)
	}
	after, ok := apperr.RetryAfterOf(err)
	if !ok || after <= lo || after > hi {
		t.Errorf("Retry-After hint %s (%v), want within (%s, %s]", after, ok, lo, hi)
	}
}

func TestCodeInterval(t *testing.T) {
	s, rec := newLimited(t, DefaultLimits)
	ctx := context.Background()

	t.Run("a second code within the interval is refused", func(t *testing.T) {
		phone, addr := testPhone(t, s), testAddr(t, s)
		code := mustSend(t, s, phone, addr)
		_, err := s.SendCode(ctx, phone, addr)
		expectRefused(t, err, ErrCodeTooSoon, 55*time.Second, time.Minute)
		// The refused request sent nothing and left the first code as it
		// was: it still logs in.
		if got := rec.sent(phone); len(got) != 1 || got[0] != code {
			t.Errorf("codes sent %v, want only %s", got, code)
		}
		if err := login(s, phone, code, addr); err != nil {
			t.Errorf("login with the first code after a refused resend: %v", err)
		}
	})

	t.Run("two requests at once send one code", func(t *testing.T) {
		phone, addr := testPhone(t, s), testAddr(t, s)
		const n = 16
		errs := make(chan error, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				<-start
				_, err := s.SendCode(ctx, phone, addr)
				errs <- err
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		sent := 0
		for err := range errs {
			switch {
			case err == nil:
				sent++
			case !errors.Is(err, ErrCodeTooSoon):
				t.Errorf("unexpected error: %v", err)
			}
		}
		if sent != 1 || len(rec.sent(phone)) != 1 {
			t.Errorf("%d requests answered sent, %d codes sent; want 1 and 1", sent, len(rec.sent(phone)))
		}
	})

	t.Run("after the interval, another code", func(t *testing.T) {
		l := DefaultLimits
		// Long enough that the refusal comes within it on a loaded machine.
		l.CodeInterval = 2 * time.Second
		s, _ := newLimited(t, l)
		phone, addr := testPhone(t, s), testAddr(t, s)
		mustSend(t, s, phone, addr)
		_, err := s.SendCode(ctx, phone, addr)
		expectRefused(t, err, ErrCodeTooSoon, 0, l.CodeInterval)
		time.Sleep(l.CodeInterval + 100*time.Millisecond)
		mustSend(t, s, phone, addr)
	})

	t.Run("0 turns the interval off", func(t *testing.T) {
		l := DefaultLimits
		l.CodeInterval = 0
		s, _ := newLimited(t, l)
		phone, addr := testPhone(t, s), testAddr(t, s)
		for range 3 {
			mustSend(t, s, phone, addr)
		}
	})
}

func TestCodesPerDay(t *testing.T) {
	l := DefaultLimits
	l.CodeInterval = 0 // so that the day's limit is what refuses
	s, _ := newLimited(t, l)
	ctx := context.Background()

	t.Run("a phone gets CodesPerDay codes a day", func(t *testing.T) {
		phone, addr := testPhone(t, s), testAddr(t, s)
		for range l.CodesPerDay {
			mustSend(t, s, phone, addr)
		}
		_, err := s.SendCode(ctx, phone, addr)
		expectRefused(t, err, ErrTooManyCodes, 23*time.Hour, 24*time.Hour)
	})

	// Else a stranger asking for ten codes would keep the owner from
	// logging in for a day.
	t.Run("an address the phone logged in from is neither counted nor refused", func(t *testing.T) {
		phone, owner, stranger := testPhone(t, s), testAddr(t, s), testAddr(t, s)
		// The first code counts: the address is not trusted yet.
		expectLogin(t, s, phone, mustSend(t, s, phone, owner), owner)
		for range l.CodesPerDay - 1 {
			mustSend(t, s, phone, stranger)
		}
		_, err := s.SendCode(ctx, phone, stranger)
		expectRefused(t, err, ErrTooManyCodes, 23*time.Hour, 24*time.Hour)
		for range 3 {
			expectLogin(t, s, phone, mustSend(t, s, phone, owner), owner)
		}
	})
}

func TestCodesPerAddress(t *testing.T) {
	s, rec := newLimited(t, DefaultLimits)
	ctx := context.Background()
	addr := testAddr(t, s)
	for i := range DefaultLimits.CodesPerAddrPerMin {
		if _, err := s.SendCode(ctx, testPhone(t, s), addr); err != nil {
			t.Fatalf("request %d from %s: %v", i+1, addr, err)
		}
	}
	phone := testPhone(t, s)
	_, err := s.SendCode(ctx, phone, addr)
	expectRefused(t, err, ErrAddrBusy, 50*time.Second, time.Minute)
	if len(rec.sent(phone)) != 0 {
		t.Errorf("a code was sent to %s past the address's limit", phone)
	}
	// Another address is not slowed down.
	if _, err := s.SendCode(ctx, phone, testAddr(t, s)); err != nil {
		t.Errorf("the same phone from another address: %v", err)
	}
}

// An IPv6 client can pick any address in its /64: the /64 is counted.
func TestAddrKey(t *testing.T) {
	tests := []struct{ a, b string }{
		{"2001:db8:1:2::1", "2001:db8:1:2:ffff:ffff:ffff:fffe"},
		{"2001:db8:1:2::1", "2001:db8:1:2::1%eth0"},
		{"203.0.113.7", "::ffff:203.0.113.7"},
	}
	for _, tt := range tests {
		if addrKey(tt.a) != addrKey(tt.b) {
			t.Errorf("%s and %s are counted apart (%s, %s)", tt.a, tt.b, addrKey(tt.a), addrKey(tt.b))
		}
	}
	apart := []struct{ a, b string }{
		{"2001:db8:1:2::1", "2001:db8:1:3::1"},
		{"203.0.113.7", "203.0.113.8"},
	}
	for _, tt := range apart {
		if addrKey(tt.a) == addrKey(tt.b) {
			t.Errorf("%s and %s are counted together (%s)", tt.a, tt.b, addrKey(tt.a))
		}
	}
}

// One phone's keys must hash to one Cluster slot, which Redis decides by
// the part between the first { and the next }: the keys of every address
// on the phone included.
func TestPhoneKeysShareASlot(t *testing.T) {
	for _, addr := range []string{"203.0.113.7", "2001:db8:1:2::1", "not an address"} {
		k := keysOf("13812345678", addr)
		for _, key := range []string{k.codes, k.wait, k.sent, k.failed, k.pair, k.trust} {
			open := strings.IndexByte(key, '{')
			end := strings.IndexByte(key[open+1:], '}')
			if open < 0 || end <= 0 || key[open+1:open+1+end] != "13812345678" {
				t.Errorf("key %q is not tagged {13812345678}", key)
			}
		}
	}
}

// TestStrangerCannotLockOwnerOut is issue 22's attack: strangers from
// many addresses ask for the owner's codes and guess at them until every
// limit refuses them, and the owner, from the address they logged in
// from before, still logs in, with the code they had received before the
// strangers came and with a new one. (Before, ten wrong guesses locked
// the phone for 15 minutes, and a stranger's code replaced the owner's.)
func TestStrangerCannotLockOwnerOut(t *testing.T) {
	l := DefaultLimits
	l.CodeInterval = 0         // the strangers ask for codes at once
	l.CodesPerDay = 5          // and run out of them
	l.PhoneGuessesPerHour = 10 // and of the phone's guesses
	s, rec := newLimited(t, l)
	ctx := context.Background()
	phone, owner := testPhone(t, s), testAddr(t, s)

	// The owner logged in from home once; now they ask for a code.
	expectLogin(t, s, phone, mustSend(t, s, phone, owner), owner)
	code := mustSend(t, s, phone, owner)

	// Strangers ask for codes until the phone's day is over (the owner's
	// first code counted: it came before the address was trusted), and
	// after each, three addresses guess until they are refused.
	refused := map[error]int{}
	for range l.CodesPerDay - 1 {
		mustSend(t, s, phone, testAddr(t, s))
		guess := wrongCode(rec.sent(phone)...)
		for range 3 {
			addr := testAddr(t, s)
			for range l.FreeGuesses + 2 {
				err := login(s, phone, guess, addr)
				for _, e := range []error{ErrWrongCode, ErrGuessTooSoon, ErrPhoneGuessedOut} {
					if errors.Is(err, e) {
						refused[e]++
						err = nil
					}
				}
				if err != nil {
					t.Fatalf("a stranger's guess: %v", err)
				}
			}
		}
	}
	_, err := s.SendCode(ctx, phone, testAddr(t, s))
	expectRefused(t, err, ErrTooManyCodes, 23*time.Hour, 24*time.Hour)
	if refused[ErrWrongCode] != l.PhoneGuessesPerHour || refused[ErrPhoneGuessedOut] == 0 || refused[ErrGuessTooSoon] == 0 {
		t.Fatalf("the strangers' answers %v, want %d wrong, then waits and the phone's budget", refused, l.PhoneGuessesPerHour)
	}

	// The owner logs in with the code they had, and with a new one.
	expectLogin(t, s, phone, code, owner)
	expectLogin(t, s, phone, mustSend(t, s, phone, owner), owner)
}

func TestLiveCodes(t *testing.T) {
	l := DefaultLimits
	l.CodeInterval = 0
	s, _ := newLimited(t, l)
	ctx := context.Background()

	t.Run("a new code does not replace the earlier ones", func(t *testing.T) {
		phone, addr := testPhone(t, s), testAddr(t, s)
		var codes []string
		for range 3 {
			codes = append(codes, mustSend(t, s, phone, addr))
		}
		// Oldest first, but any order works; each logs in once.
		for _, code := range codes {
			expectLogin(t, s, phone, code, addr)
		}
		expectWrong(t, s, phone, codes[0], addr)
	})

	t.Run("the oldest go past the cap", func(t *testing.T) {
		phone, addr := testPhone(t, s), testAddr(t, s)
		var codes []string
		for range liveCodes + 2 {
			codes = append(codes, mustSend(t, s, phone, addr))
		}
		if n := s.rdb.ZCard(ctx, CodeKey(phone)).Val(); n != liveCodes {
			t.Errorf("%d live codes, want %d", n, liveCodes)
		}
		newest, err := s.rdb.ZRange(ctx, CodeKey(phone), -1, -1).Result()
		if err != nil || len(newest) != 1 || newest[0] != codes[len(codes)-1] {
			t.Errorf("newest code in %s: %v, %v; want %s", CodeKey(phone), newest, err, codes[len(codes)-1])
		}
		// The free guesses of this pair are more than the two dropped.
		expectWrong(t, s, phone, codes[0], addr)
		expectWrong(t, s, phone, codes[1], addr)
		expectLogin(t, s, phone, codes[liveCodes+1], addr)
		expectLogin(t, s, phone, codes[2], addr)
	})

	t.Run("each code expires five minutes after it was sent", func(t *testing.T) {
		phone, addr := testPhone(t, s), testAddr(t, s)
		mustSend(t, s, phone, addr)
		now, err := s.rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		codes, err := s.rdb.ZRangeWithScores(ctx, CodeKey(phone), 0, -1).Result()
		if err != nil || len(codes) != 1 {
			t.Fatalf("codes %v, %v", codes, err)
		}
		expires := time.UnixMilli(int64(codes[0].Score))
		if d := expires.Sub(now); d <= codeTTL-time.Minute || d > codeTTL {
			t.Errorf("the code expires in %s, want about %s", d, codeTTL)
		}
		if ttl := s.rdb.PTTL(ctx, CodeKey(phone)).Val(); ttl <= 0 || ttl > codeTTL {
			t.Errorf("the codes' key lives %s, want at most %s", ttl, codeTTL)
		}
	})
}

// guessLimits are limits whose only one that matters is what the test
// sets: the others are out of reach.
func guessLimits() Limits {
	l := DefaultLimits
	l.CodeInterval = 0
	l.CodesPerDay = 0
	l.CodesPerAddrPerMin = 0
	l.FreeGuesses = 1000
	l.FreeGuessesPerAddr = 100_000
	l.PhoneGuessesPerHour = 100
	return l
}

func TestPairDelays(t *testing.T) {
	l := guessLimits()
	l.FreeGuesses = 2
	// Long enough that each refusal comes within it on a loaded machine.
	l.MaxGuessDelay = 2 * time.Second
	s, _ := newLimited(t, l)
	ctx := context.Background()

	t.Run("free guesses, then waits that double up to the longest", func(t *testing.T) {
		phone, addr := testPhone(t, s), testAddr(t, s)
		code := mustSend(t, s, phone, addr)
		guess := wrongCode(code)
		for range l.FreeGuesses {
			expectWrong(t, s, phone, guess, addr)
		}
		expectWrong(t, s, phone, guess, addr) // the first past the free ones: 1 s
		err := login(s, phone, guess, addr)
		expectRefused(t, err, ErrGuessTooSoon, 0, time.Second)
		// The wait is for every attempt of the pair, the right code's too:
		// else the waits would only slow down a guesser who could go on
		// guessing and be told when they won.
		err = login(s, phone, code, addr)
		expectRefused(t, err, ErrGuessTooSoon, 0, time.Second)
		// Only the guessing address waits: another one guesses on.
		expectWrong(t, s, phone, guess, testAddr(t, s))

		time.Sleep(time.Second + 100*time.Millisecond)
		expectWrong(t, s, phone, guess, addr) // 2 s
		err = login(s, phone, guess, addr)
		expectRefused(t, err, ErrGuessTooSoon, time.Second, 2*time.Second)
		time.Sleep(2*time.Second + 100*time.Millisecond)
		expectWrong(t, s, phone, guess, addr) // 4 s, but at most 2 s
		err = login(s, phone, guess, addr)
		expectRefused(t, err, ErrGuessTooSoon, time.Second, 2*time.Second)
	})

	t.Run("a login clears the pair's count", func(t *testing.T) {
		phone, addr := testPhone(t, s), testAddr(t, s)
		code := mustSend(t, s, phone, addr)
		guess := wrongCode(code)
		for range l.FreeGuesses {
			expectWrong(t, s, phone, guess, addr)
		}
		expectLogin(t, s, phone, code, addr)
		code = mustSend(t, s, phone, addr)
		for range l.FreeGuesses + 1 {
			expectWrong(t, s, phone, wrongCode(code), addr)
		}
		_, err := s.SendCode(ctx, phone, addr) // asking for codes is not guessing
		if err != nil {
			t.Errorf("a code while the pair waits: %v", err)
		}
	})

	t.Run("guesses at once from one address: the free ones and one more", func(t *testing.T) {
		phone, addr := testPhone(t, s), testAddr(t, s)
		guess := wrongCode(mustSend(t, s, phone, addr))
		got := together(20, func() error { return login(s, phone, guess, addr) })
		if got[ErrWrongCode] != l.FreeGuesses+1 || got[ErrGuessTooSoon] != 20-l.FreeGuesses-1 {
			t.Errorf("answers %v, want %d wrong, the rest told to wait", got, l.FreeGuesses+1)
		}
	})
}

func TestAddrDelays(t *testing.T) {
	l := guessLimits()
	l.FreeGuessesPerAddr = 3
	l.MaxAddrDelay = 2 * time.Second
	s, _ := newLimited(t, l)

	t.Run("free guesses over all phones, then waits", func(t *testing.T) {
		addr := testAddr(t, s)
		for range l.FreeGuessesPerAddr + 1 { // the last waits 1 s
			expectWrong(t, s, testPhone(t, s), "000000", addr)
		}
		phone := testPhone(t, s)
		code := mustSend(t, s, phone, addr)
		err := login(s, phone, code, addr)
		expectRefused(t, err, ErrAddrGuessTooSoon, 0, time.Second)
		// Another address is not slowed down.
		expectLogin(t, s, phone, code, testAddr(t, s))
		time.Sleep(time.Second + 100*time.Millisecond)
		expectWrong(t, s, testPhone(t, s), "000000", addr) // 2 s
		err = login(s, testPhone(t, s), "000000", addr)
		expectRefused(t, err, ErrAddrGuessTooSoon, time.Second, 2*time.Second)
	})

	// Logins are not wrong guesses; but a login does not clear the
	// address's count either, or a guesser would log in to a phone of
	// their own between rounds.
	t.Run("logins are not counted, and do not clear the count", func(t *testing.T) {
		addr := testAddr(t, s)
		for range l.FreeGuessesPerAddr + 2 {
			phone := testPhone(t, s)
			expectLogin(t, s, phone, mustSend(t, s, phone, addr), addr)
		}
		for range l.FreeGuessesPerAddr - 1 {
			expectWrong(t, s, testPhone(t, s), "000000", addr)
		}
		own := testPhone(t, s)
		expectLogin(t, s, own, mustSend(t, s, own, addr), addr)
		expectWrong(t, s, testPhone(t, s), "000000", addr) // the last free one
		expectWrong(t, s, testPhone(t, s), "000000", addr) // the first to wait
		err := login(s, testPhone(t, s), "000000", addr)
		expectRefused(t, err, ErrAddrGuessTooSoon, 0, time.Second)
	})

	// Past its free guesses, a login from the address (the owner's, on a
	// shared address) does not set a wait of its own: only wrong guesses
	// are counted, and the wait ends when theirs does.
	t.Run("a login past the free guesses sets no wait", func(t *testing.T) {
		addr := testAddr(t, s)
		for range l.FreeGuessesPerAddr + 1 { // the last waits 1 s
			expectWrong(t, s, testPhone(t, s), "000000", addr)
		}
		time.Sleep(time.Second + 100*time.Millisecond)
		for range 3 { // were logins counted, the second would wait 2 s
			phone := testPhone(t, s)
			expectLogin(t, s, phone, mustSend(t, s, phone, addr), addr)
		}
	})

	// Raising the limit lifts the waits it no longer justifies: a server
	// restarted with more free guesses does not keep its addresses waiting.
	t.Run("a wait ends when the limit is raised", func(t *testing.T) {
		addr := testAddr(t, s)
		for range l.FreeGuessesPerAddr + 1 {
			expectWrong(t, s, testPhone(t, s), "000000", addr)
		}
		expectRefused(t, login(s, testPhone(t, s), "000000", addr), ErrAddrGuessTooSoon, 0, time.Second)
		more := l
		more.FreeGuessesPerAddr = 100
		raised, _ := newLimited(t, more) // the same Redis database
		expectWrong(t, raised, testPhone(t, raised), "000000", addr)
	})

	// An address may have only as many attempts in flight as it has free
	// guesses left and one more: guesses at once cannot all slip past the wait the
	// first of them would set. In all, the free ones and one more, from a
	// clean address as from one that guessed wrong before.
	t.Run("guesses at once over many phones: the free ones and one more", func(t *testing.T) {
		for _, before := range []int{0, 1} {
			addr := testAddr(t, s)
			for range before {
				expectWrong(t, s, testPhone(t, s), "000000", addr)
			}
			phones := make(chan string, 20)
			for range 20 {
				phones <- testPhone(t, s)
			}
			got := together(20, func() error { return login(s, <-phones, "000000", addr) })
			if want := l.FreeGuessesPerAddr + 1 - before; got[ErrWrongCode] != want || got[ErrAddrGuessTooSoon]+got[ErrAddrAtOnce] != 20-want {
				t.Errorf("%d wrong before: answers %v, want %d wrong (in all the free ones and one more), the rest refused", before, got, want)
			}
		}
	})

	// Right codes at once from one address (many users behind one NAT, a
	// load test's logins) are never made to wait: past the attempts the
	// address may have in flight, they are told to come back in a second.
	// The cap at the gate: attempts admitted and not yet settled.
	t.Run("logins at once from one address", func(t *testing.T) {
		addr := testAddr(t, s)
		const n = 40
		phones := make(chan [2]string, n)
		for range n {
			phone := testPhone(t, s)
			phones <- [2]string{phone, mustSend(t, s, phone, addr)}
		}
		got := together(n, func() error { p := <-phones; return login(s, p[0], p[1], addr) })
		if got[nil] < 1 || got[nil]+got[ErrAddrAtOnce] != n {
			t.Errorf("answers %v, want logins, and at most told to come back", got)
		}
		gate := testAddr(t, s)
		for i := range l.FreeGuessesPerAddr + 2 {
			res, err := admitGuessScript.Run(context.Background(), s.rdb, addrGuessKeys(gate),
				l.FreeGuessesPerAddr, 0, fmt.Sprint("a", i), attemptFor.Milliseconds()).Int64Slice()
			want := []int64{admitted}
			if i == l.FreeGuessesPerAddr+1 {
				want = []int64{admitAtOnce, 1000}
			}
			if err != nil || fmt.Sprint(res) != fmt.Sprint(want) {
				t.Fatalf("attempt %d in flight: %v %v, want %v", i+1, res, err, want)
			}
		}
	})

	// A client that hangs up once its guess was compared does not take
	// the count with it: the attempt is settled all the same.
	t.Run("a wrong guess whose client hung up counts", func(t *testing.T) {
		addr := testAddr(t, s)
		phone := testPhone(t, s)
		minute := func() int {
			n, _ := s.rdb.Get(context.Background(), failedKey).Int()
			return n
		}
		before := minute()
		ctx, cancel := context.WithCancel(context.Background())
		s.afterCheck = cancel
		_, _, err := s.Login(ctx, phone, "000000", addr)
		s.afterCheck = nil
		if !errors.Is(err, ErrWrongCode) {
			t.Fatalf("login cancelled after the check: %v, want ErrWrongCode", err)
		}
		// (Other tests of the package may count too: at least one more.)
		if after := minute(); after < before+1 {
			t.Errorf("the minute's count of wrong guesses went from %d to %d, want at least one more", before, after)
		}
		keys := addrGuessKeys(addr)
		if n, err := s.rdb.HGet(context.Background(), keys[0], "n").Int(); err != nil || n != 1 {
			t.Errorf("the address's count after the hang-up: %d, %v; want 1", n, err)
		}
		if left, err := s.rdb.ZCard(context.Background(), keys[1]).Result(); err != nil || left != 0 {
			t.Errorf("attempts still in flight after the hang-up: %d, %v; want 0", left, err)
		}
	})
}

func TestPhoneGuessesPerHour(t *testing.T) {
	l := guessLimits()
	l.PhoneGuessesPerHour = 5
	s, _ := newLimited(t, l)

	t.Run("strangers are refused for the hour; the owner is not", func(t *testing.T) {
		phone, owner := testPhone(t, s), testAddr(t, s)
		expectLogin(t, s, phone, mustSend(t, s, phone, owner), owner)
		code := mustSend(t, s, phone, owner)
		guess := wrongCode(code)
		// The owner's own typos are not the phone's budget.
		for range 2 {
			expectWrong(t, s, phone, guess, owner)
		}
		for range l.PhoneGuessesPerHour {
			expectWrong(t, s, phone, guess, testAddr(t, s))
		}
		stranger := testAddr(t, s)
		err := login(s, phone, guess, stranger)
		expectRefused(t, err, ErrPhoneGuessedOut, 59*time.Minute, time.Hour)
		// An address the phone never logged in from waits for the hour,
		// even with the right code: that is what the budget costs.
		err = login(s, phone, code, stranger)
		expectRefused(t, err, ErrPhoneGuessedOut, 59*time.Minute, time.Hour)
		expectWrong(t, s, phone, guess, owner)
		expectLogin(t, s, phone, code, owner)
	})

	t.Run("guesses at once from many addresses: exactly the budget", func(t *testing.T) {
		phone := testPhone(t, s)
		addrs := make(chan string, 30)
		for range 30 {
			addrs <- testAddr(t, s)
		}
		got := together(30, func() error { return login(s, phone, "000000", <-addrs) })
		if got[ErrWrongCode] != l.PhoneGuessesPerHour || got[ErrPhoneGuessedOut] != 30-l.PhoneGuessesPerHour {
			t.Errorf("answers %v, want %d wrong and the rest refused", got, l.PhoneGuessesPerHour)
		}
	})
}

// Many wrong guesses everywhere take the free guesses away, but for
// trusted pairs. The count is shared with every test on this Redis, so
// the test fills it itself and asserts only what follows.
func TestAttack(t *testing.T) {
	l := guessLimits()
	l.FreeGuesses = 3
	l.FreeGuessesPerAddr = 3
	l.AttackGuessesPerMin = 5
	s, _ := newLimited(t, l)
	phone, owner := testPhone(t, s), testAddr(t, s)
	expectLogin(t, s, phone, mustSend(t, s, phone, owner), owner)
	for range l.AttackGuessesPerMin {
		expectWrong(t, s, testPhone(t, s), "000000", testAddr(t, s))
	}

	// A stranger waits from the first wrong guess, at its address ...
	stranger := testAddr(t, s)
	expectWrong(t, s, phone, "000000", stranger)
	err := login(s, phone, "000000", stranger)
	expectRefused(t, err, ErrAddrGuessTooSoon, 0, time.Second)
	// ... and at the pair.
	ctx := context.Background()
	now, err := s.rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if until, err := s.rdb.HGet(ctx, keysOf(phone, stranger).pair, "until").Int64(); err != nil || until <= now.UnixMilli() {
		t.Errorf("the pair's wait after its first wrong guess ends at %d, %v; want after %d", until, err, now.UnixMilli())
	}
	// The owner keeps their free guesses.
	code := mustSend(t, s, phone, owner)
	for range l.FreeGuesses {
		expectWrong(t, s, phone, wrongCode(code), owner)
	}
	expectLogin(t, s, phone, code, owner)

	// Guesses at once from a new address: one in flight at a time, and
	// one wrong guess in all.
	burst := testAddr(t, s)
	phones := make(chan string, 20)
	for range 20 {
		phones <- testPhone(t, s)
	}
	got := together(20, func() error { return login(s, <-phones, "000000", burst) })
	if got[ErrWrongCode] != 1 || got[ErrAddrGuessTooSoon]+got[ErrAddrAtOnce] != 19 {
		t.Errorf("guesses at once during an attack: %v, want 1 wrong, the rest refused", got)
	}
}

// together runs f n times at once and counts its answers by sentinel.
func together(n int, f func() error) map[error]int {
	sentinels := []error{ErrWrongCode, ErrGuessTooSoon, ErrAddrGuessTooSoon, ErrAddrAtOnce, ErrPhoneGuessedOut}
	start := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := map[error]int{}
	for range n {
		wg.Go(func() {
			<-start
			err := f()
			mu.Lock()
			defer mu.Unlock()
			for _, s := range sentinels {
				if errors.Is(err, s) {
					got[s]++
					return
				}
			}
			got[err]++
		})
	}
	close(start)
	wg.Wait()
	return got
}

func TestSenders(t *testing.T) {
	const phone, code = "13812345678", "493817"
	tests := []struct {
		name     string
		sender   func(*slog.Logger) Sender
		logsCode bool
	}{
		{"LogSender", func(l *slog.Logger) Sender { return NewLogSender(l) }, false},
		{"DevSender", func(l *slog.Logger) Sender { return NewDevSender(l) }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := tt.sender(slog.New(slog.NewTextHandler(&buf, nil))).Send(context.Background(), phone, code); err != nil {
				t.Fatal(err)
			}
			out := buf.String()
			if got := strings.Contains(out, code); got != tt.logsCode {
				t.Errorf("the log holds the code: %v, want %v:\n%s", got, tt.logsCode, out)
			}
			if !tt.logsCode && (strings.Contains(out, phone) || !strings.Contains(out, "138****5678")) {
				t.Errorf("the log should hold the phone masked, 138****5678:\n%s", out)
			}
		})
	}
}

// On Redis Cluster each script's keys must be in one slot (else the
// script fails with CROSSSLOT): a phone's keys share its hash tag, and an
// address's keys and the global count have scripts of their own. This
// drives every script there, on a cluster of its own.
func TestLimitsOnCluster(t *testing.T) {
	rdb := testenv.StartCluster(t).Client(t)
	db := testenv.Open(t, testenv.MySQLDSN(t))
	tokens := NewTokens([]byte("limits-test-key-0123456789abcdef"), time.Hour, rdb, time.Now)
	l := guessLimits()
	l.FreeGuesses = 1
	l.FreeGuessesPerAddr = 1
	l.PhoneGuessesPerHour = 2
	l.CodesPerDay = 2
	l.CodesPerAddrPerMin = 10
	s := NewService(db, rdb, tokens, nil, &recorder{}, l)
	ctx := context.Background()
	phone, owner := "13700000001", "203.0.113.1"

	expectLogin(t, s, phone, mustSend(t, s, phone, owner), owner)
	code := mustSend(t, s, phone, owner)
	guess := wrongCode(code)
	expectWrong(t, s, phone, guess, "203.0.113.2")
	expectWrong(t, s, phone, guess, "203.0.113.2") // the pair and the address wait
	err := login(s, phone, guess, "203.0.113.2")
	expectRefused(t, err, ErrAddrGuessTooSoon, 0, time.Second)
	err = login(s, phone, guess, "203.0.113.3") // the phone's budget is spent
	expectRefused(t, err, ErrPhoneGuessedOut, 59*time.Minute, time.Hour)
	expectWrong(t, s, phone, guess, owner)
	expectLogin(t, s, phone, code, owner)
	if n, err := rdb.Get(ctx, failedKey).Int(); err != nil || n < 3 {
		t.Errorf("wrong guesses of the minute: %d, %v; want 3 or more", n, err)
	}
}
