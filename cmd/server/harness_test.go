package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"seckill/internal/testenv"
)

// The tests in this package drive whole servers over HTTP: in-process
// instances started through run, exactly as main starts them, or real
// child processes where a test must kill one.

const (
	testSecret    = "test-secret-0123456789abcdef0123456789"    // 38 bytes: JWT_SECRET needs 32
	testPaySecret = "test-pay-secret-0123456789abcdef012345678" // PAYMENT_WEBHOOK_SECRET needs 32 too
	adminPhone    = "13800000000"
)

// stack is one MySQL database and one Redis database that instances share.
type stack struct {
	DSN     string
	RedisDB int
}

// newStack makes a fresh database. redisDB is the logical Redis database:
// 0 is shared by every test; any other number belongs to one test alone
// and is flushed first (async tests need one: the orders stream is one
// per Redis database).
func newStack(t *testing.T, redisDB int) stack {
	t.Helper()
	if redisDB != 0 {
		if err := testenv.Redis(t, redisDB).FlushDB(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
	}
	return stack{DSN: testenv.MySQLDSN(t), RedisDB: redisDB}
}

// env is the environment of an instance on s listening on addr.
func (s stack) env(addr string, extra ...string) map[string]string {
	e := map[string]string{
		"HTTP_ADDR":              addr,
		"MYSQL_DSN":              s.DSN,
		"REDIS_ADDR":             testenvRedisAddr(),
		"REDIS_DB":               strconv.Itoa(s.RedisDB),
		"JWT_SECRET":             testSecret,
		"PAYMENT_WEBHOOK_SECRET": testPaySecret,
		"ADMIN_PHONES":           adminPhone,
		"AUTH_DEV_CODES":         "true",
		"MYSQL_MAX_OPEN_CONNS":   "10",
		"SWEEP_EVERY":            "500ms",
		// The tests log hundreds of users in from 127.0.0.1, and the
		// admin phone again and again in one Redis database, so the
		// limits on sending login codes are off (the guess limits stay).
		// The tests of those limits set them back: an empty value is the
		// default.
		// The sale tests fire up to 600 users at once, one request each in
		// flight, and a user's tries go round the instances: an instance
		// that stalls (the race detector, a GC) can have most of them in
		// flight at once, past the default cap of 256, and answer 429.
		// The cap has its own test (TestOverloadAnsweredAtOnce, which sets it);
		// here it stays above anything a test sends. All of it comes
		// from 127.0.0.1, one address, which may hold half the slots:
		// so twice that. For the same reason the connections per address
		// are not capped (TestSlowBodiesLeaveBuyersServed sets a cap).
		"MAX_IN_FLIGHT":      "4096",
		"MAX_CONNS_PER_ADDR": "0",
		// Tests try wrong codes from 127.0.0.1, run after run, and an
		// address's count lasts an hour: its free guesses out of reach.
		"AUTH_FREE_GUESSES":           "1000",
		"AUTH_FREE_GUESSES_PER_ADDR":  "100000",
		"AUTH_CODE_INTERVAL":          "0",
		"AUTH_CODES_PER_DAY":          "0",
		"AUTH_CODES_PER_ADDR_PER_MIN": "0",
	}
	for i := 0; i+1 < len(extra); i += 2 {
		e[extra[i]] = extra[i+1]
	}
	return e
}

func testenvRedisAddr() string {
	return os.Getenv("SECKILL_TEST_REDIS_ADDR")
}

// freeAddr returns a loopback address with a port nobody listens on.
func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// instance is a server started in-process with run.
type instance struct {
	Base string
	stop context.CancelFunc
	done chan error
	log  *syncBuffer
}

// start runs an instance with env and waits until it answers /healthz.
// It is stopped (as by SIGTERM) when the test ends.
func start(t *testing.T, env map[string]string) *instance {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	in := &instance{Base: "http://" + env["HTTP_ADDR"], stop: cancel, done: make(chan error, 1), log: &syncBuffer{}}
	// run's error goes to Stop and, while it starts, to waitHealthy: one
	// channel read by both would leave Stop waiting for ever on a server
	// that failed to start.
	exited := make(chan error, 1)
	go func() {
		err := run(ctx, func(k string) string { return env[k] }, in.log)
		in.done <- err
		exited <- err
	}()
	t.Cleanup(func() {
		in.Stop()
		if t.Failed() {
			t.Logf("warnings and errors of %s:\n%s", in.Base, problems(in.log.String()))
		}
	})
	waitHealthy(t, in.Base, exited)
	return in
}

// Stop shuts the instance down and returns run's error.
func (in *instance) Stop() error {
	in.stop()
	err, ok := <-in.done
	if ok {
		close(in.done)
	}
	return err
}

func waitHealthy(t testing.TB, base string, died <-chan error) {
	t.Helper()
	waitAnswers(t, base, "/healthz", died)
}

// waitAnswers waits up to 30 s for the server at base to answer 200 on
// path, failing the test at once if died says that it exited.
func waitAnswers(t testing.TB, base, path string, died <-chan error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-died:
			t.Fatalf("server %s exited while starting: %v", base, err)
		default:
		}
		resp, err := http.Get(base + path)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("server %s did not answer 200 on %s in 30s", base, path)
}

// client is a shared HTTP client with enough idle connections for the
// concurrent tests.
var client = &http.Client{
	Timeout:   30 * time.Second,
	Transport: &http.Transport{MaxIdleConnsPerHost: 512, MaxIdleConns: 2048},
}

// reply is a decoded answer.
type reply struct {
	Status int
	Header http.Header
	Body   map[string]any
	Raw    string
}

// Code is the error code of an error reply.
func (r reply) Code() string {
	e, _ := r.Body["error"].(map[string]any)
	s, _ := e["code"].(string)
	return s
}

// Str returns a top-level string field.
func (r reply) Str(name string) string { s, _ := r.Body[name].(string); return s }

// call sends a request; body may be nil, a string (sent as is) or a value
// (sent as JSON). It returns an error instead of failing the test, so it
// can be used from many goroutines.
func call(method, url, token string, body any) (reply, error) {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		buf, _ := json.Marshal(b)
		rd = bytes.NewReader(buf)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, err
	}
	r := reply{Status: resp.StatusCode, Header: resp.Header, Raw: string(raw)}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &r.Body); err != nil {
			return r, fmt.Errorf("%s %s: answer is not JSON: %q", method, url, raw)
		}
	}
	return r, nil
}

// mustCall is call for the test goroutine.
func mustCall(t testing.TB, method, url, token string, body any) reply {
	t.Helper()
	r, err := call(method, url, token, body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// login logs phone in through the API and returns its token and user ID.
func login(base, phone string) (token, userID string, err error) {
	r, err := call("POST", base+"/auth/code", "", map[string]string{"phone": phone})
	if err != nil || r.Status != 200 {
		return "", "", fmt.Errorf("auth/code %s: %v %s", phone, err, r.Raw)
	}
	r, err = call("POST", base+"/auth/login", "", map[string]string{"phone": phone, "code": r.Str("code")})
	if err != nil || r.Status != 200 {
		return "", "", fmt.Errorf("auth/login %s: %v %s", phone, err, r.Raw)
	}
	u, _ := r.Body["user"].(map[string]any)
	id, _ := u["id"].(string)
	return r.Str("token"), id, nil
}

func mustLogin(t testing.TB, base, phone string) (string, string) {
	t.Helper()
	tok, id, err := login(base, phone)
	if err != nil {
		t.Fatal(err)
	}
	return tok, id
}

// user is a logged-in test user.
type user struct{ Token, ID string }

// loginMany logs in n users with distinct phones, 32 at a time.
func loginMany(t testing.TB, base string, n int) []user {
	t.Helper()
	users := make([]user, n)
	errs := make(chan error, n)
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	prefix := 13000000000 + (testenv.ID()%9000)*100000
	for i := range users {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			tok, id, err := login(base, strconv.FormatInt(prefix+int64(i), 10))
			if err != nil {
				errs <- err
				return
			}
			users[i] = user{tok, id}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return users
}

// createVoucher creates a voucher on sale from begin to end.
func createVoucher(t testing.TB, base, adminToken string, stock int, begin, end time.Time, extra ...any) string {
	t.Helper()
	body := map[string]any{
		"title": "test voucher", "stock": stock,
		"begin_time": begin.UTC().Format(time.RFC3339), "end_time": end.UTC().Format(time.RFC3339),
	}
	for i := 0; i+1 < len(extra); i += 2 {
		body[extra[i].(string)] = extra[i+1]
	}
	r := mustCall(t, "POST", base+"/vouchers", adminToken, body)
	if r.Status != http.StatusCreated {
		t.Fatalf("create voucher: %d %s", r.Status, r.Raw)
	}
	return r.Str("id")
}

// openVoucher creates a voucher on sale for the next hour.
func openVoucher(t testing.TB, base, adminToken string, stock int) string {
	t.Helper()
	return createVoucher(t, base, adminToken, stock, time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
}

// syncBuffer is a bytes.Buffer safe for a logger and a test to share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// problems keeps the warning and error lines of a log, at most 40.
func problems(log string) string {
	var out []string
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			out = append(out, line)
		}
	}
	if len(out) > 40 {
		out = append(out[:40], fmt.Sprintf("... and %d more", len(out)-40))
	}
	return strings.Join(out, "\n")
}

func TestMain(m *testing.M) {
	// The fault tests break connections on purpose.
	testenv.QuietDrivers()
	os.Exit(m.Run())
}

// newTestApp wires the app of env without a listening server, for tests
// that drive its router directly; its stores close when the test ends.
func newTestApp(t *testing.T, env map[string]string) *app {
	t.Helper()
	cfg, err := loadConfig(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	stores, err := openStores(context.Background(), cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stores.close)
	a, err := newApp(cfg, stores, log)
	if err != nil {
		t.Fatal(err)
	}
	return a
}
