package auth

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	tokens := NewTokens([]byte("limits-test-key-0123456789abcdef"), time.Hour, time.Now)
	rec := &recorder{}
	return NewService(db, rdb, tokens, nil, rec, limits), rec
}

// testPhone returns a phone no other test uses, and deletes its keys when
// the test ends.
func testPhone(t *testing.T, s *Service) string {
	t.Helper()
	phone := fmt.Sprintf("137%08d", testenv.ID()%100_000_000)
	k := keysOf(phone)
	t.Cleanup(func() { s.rdb.Del(context.Background(), k.code, k.wait, k.sent, k.misses, k.locked) })
	return phone
}

// testAddr returns an IPv4 address no other test uses, and deletes its
// count when the test ends.
func testAddr(t *testing.T, s *Service) string {
	t.Helper()
	n := testenv.ID()
	addr := fmt.Sprintf("10.%d.%d.%d", n>>16&0xff, n>>8&0xff, n&0xff)
	t.Cleanup(func() { s.rdb.Del(context.Background(), addrKey(addr)) })
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

// wrongCode is a code that is not code.
func wrongCode(code string) string {
	n, _ := strconv.Atoi(code)
	return fmt.Sprintf("%06d", (n+1)%1_000_000)
}

// expectWrong checks that logging in with code is refused as a wrong code
// (401), not as a lock.
func expectWrong(t *testing.T, s *Service, phone, code string) {
	t.Helper()
	if _, _, err := s.Login(context.Background(), phone, code); !errors.Is(err, ErrWrongCode) {
		t.Fatalf("Login(%s, %s) = %v, want ErrWrongCode", phone, code, err)
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
		if _, _, err := s.Login(ctx, phone, code); err != nil {
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
	phone, addr := testPhone(t, s), testAddr(t, s)
	for range l.CodesPerDay {
		mustSend(t, s, phone, addr)
	}
	_, err := s.SendCode(context.Background(), phone, addr)
	expectRefused(t, err, ErrTooManyCodes, 23*time.Hour, 24*time.Hour)
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
// the part between the first { and the next }.
func TestPhoneKeysShareASlot(t *testing.T) {
	k := keysOf("13812345678")
	for _, key := range []string{k.code, k.wait, k.sent, k.misses, k.locked} {
		open := strings.IndexByte(key, '{')
		end := strings.IndexByte(key[open+1:], '}')
		if open < 0 || end <= 0 || key[open+1:open+1+end] != "13812345678" {
			t.Errorf("key %q is not tagged {13812345678}", key)
		}
	}
}

func TestWrongGuesses(t *testing.T) {
	l := DefaultLimits
	l.CodeInterval = 0 // resends at once
	s, _ := newLimited(t, l)
	ctx := context.Background()

	t.Run("four wrong, then the right code logs in", func(t *testing.T) {
		phone, addr := testPhone(t, s), testAddr(t, s)
		code := mustSend(t, s, phone, addr)
		for range l.GuessesPerCode - 1 {
			expectWrong(t, s, phone, wrongCode(code))
		}
		if _, _, err := s.Login(ctx, phone, code); err != nil {
			t.Fatalf("right code after %d wrong guesses: %v", l.GuessesPerCode-1, err)
		}
	})

	t.Run("five wrong burn the code", func(t *testing.T) {
		phone, addr := testPhone(t, s), testAddr(t, s)
		code := mustSend(t, s, phone, addr)
		for range l.GuessesPerCode {
			expectWrong(t, s, phone, wrongCode(code))
		}
		expectWrong(t, s, phone, code)
		// A new code works: burning a code is not a lock.
		if _, _, err := s.Login(ctx, phone, mustSend(t, s, phone, addr)); err != nil {
			t.Errorf("new code after a burnt one: %v", err)
		}
	})

	// Resends replace the code and its count of tries, not the phone's
	// wrong guesses of the day: 4 wrong, resend, 5 wrong (burnt), resend,
	// 1 wrong makes 10, and the phone is locked.
	t.Run("guesses survive resends", func(t *testing.T) {
		phone, addr := testPhone(t, s), testAddr(t, s)
		for _, wrong := range []int{4, 5, 1} {
			code := mustSend(t, s, phone, addr)
			for range wrong {
				expectWrong(t, s, phone, wrongCode(code))
			}
		}
		// The third code was burnt by the lock; the phone gets no new
		// code, and no code logs it in.
		_, err := s.SendCode(ctx, phone, addr)
		expectRefused(t, err, ErrPhoneLocked, 14*time.Minute, 15*time.Minute)
		_, _, err = s.Login(ctx, phone, "000000")
		expectRefused(t, err, ErrPhoneLocked, 14*time.Minute, 15*time.Minute)
	})

	t.Run("the daily lock refuses even the right code", func(t *testing.T) {
		l := l
		l.GuessesPerCode = 100 // one code, so the right one is still stored
		s, _ := newLimited(t, l)
		phone, addr := testPhone(t, s), testAddr(t, s)
		code := mustSend(t, s, phone, addr)
		for range l.GuessesPerDay - 1 {
			expectWrong(t, s, phone, wrongCode(code))
		}
		// The tenth wrong guess is answered as wrong; it locks the phone.
		expectWrong(t, s, phone, wrongCode(code))
		_, _, err := s.Login(ctx, phone, code)
		expectRefused(t, err, ErrPhoneLocked, 14*time.Minute, 15*time.Minute)
	})

	t.Run("wrong guesses at once are all counted", func(t *testing.T) {
		l := l
		l.GuessesPerCode = 100
		s, _ := newLimited(t, l)
		phone, addr := testPhone(t, s), testAddr(t, s)
		code := mustSend(t, s, phone, addr)
		const n = 30
		start := make(chan struct{})
		var wg sync.WaitGroup
		var mu sync.Mutex
		answers := map[string]int{}
		for range n {
			wg.Go(func() {
				<-start
				_, _, err := s.Login(ctx, phone, wrongCode(code))
				mu.Lock()
				defer mu.Unlock()
				switch {
				case errors.Is(err, ErrWrongCode):
					answers["wrong"]++
				case errors.Is(err, ErrPhoneLocked):
					answers["locked"]++
				default:
					answers[fmt.Sprint(err)]++
				}
			})
		}
		close(start)
		wg.Wait()
		// Exactly GuessesPerDay guesses reach the code; the rest meet the
		// lock the last of them set.
		if answers["wrong"] != l.GuessesPerDay || answers["locked"] != n-l.GuessesPerDay {
			t.Errorf("answers %v, want %d wrong and %d locked", answers, l.GuessesPerDay, n-l.GuessesPerDay)
		}
		_, _, err := s.Login(ctx, phone, code)
		expectRefused(t, err, ErrPhoneLocked, 14*time.Minute, 15*time.Minute)
	})

	// After the lock, the day's count stays: each further wrong guess
	// that day locks the phone again, and the right code still logs in.
	t.Run("after the lock", func(t *testing.T) {
		l := l
		// Long enough that the refusals come within it on a loaded machine.
		l.LockFor = 2 * time.Second
		s, _ := newLimited(t, l)
		phone, addr := testPhone(t, s), testAddr(t, s)
		for range l.GuessesPerDay / l.GuessesPerCode { // two codes, five wrong each
			code := mustSend(t, s, phone, addr)
			for range l.GuessesPerCode {
				expectWrong(t, s, phone, wrongCode(code))
			}
		}
		_, err := s.SendCode(ctx, phone, addr)
		expectRefused(t, err, ErrPhoneLocked, 0, l.LockFor)
		time.Sleep(l.LockFor + 100*time.Millisecond)
		code := mustSend(t, s, phone, addr)
		expectWrong(t, s, phone, wrongCode(code))
		_, _, err = s.Login(ctx, phone, code)
		expectRefused(t, err, ErrPhoneLocked, 0, l.LockFor)
		time.Sleep(l.LockFor + 100*time.Millisecond)
		if _, _, err := s.Login(ctx, phone, mustSend(t, s, phone, addr)); err != nil {
			t.Errorf("right code once the lock ended: %v", err)
		}
	})
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
