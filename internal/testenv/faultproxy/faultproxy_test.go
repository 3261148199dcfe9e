package faultproxy_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"

	"seckill/internal/testenv"
	"seckill/internal/testenv/faultproxy"
)

func TestMain(m *testing.M) {
	// A proxy's goroutines must be gone once it is closed.
	testenv.Main(m)
}

// timeout is the clients' timeout under a blackhole. Short, so the tests are
// quick; the proxy adds nothing measurable on loopback.
const timeout = 300 * time.Millisecond

// A backend is a real server behind a proxy, seen through the few requests
// every fault test needs, so that each fault is shown on MariaDB and Redis
// alike.
type backend interface {
	// roundTrip sends a cheap request and waits for its reply.
	roundTrip(ctx context.Context) error
	// slow sends a request the server answers only after 3s.
	slow(ctx context.Context) error
	// slowRunning reports, asking on a connection of its own, whether the
	// server is running slow's request now.
	slowRunning(t *testing.T) bool
	// write writes a fresh value, and written reports, asking on a
	// connection of its own, whether that write took effect.
	write(ctx context.Context) error
	written(t *testing.T) bool
}

// backends returns, for each real server, a proxy in front of it and a
// backend whose client goes through the proxy with the given timeout.
var backends = []struct {
	name  string
	start func(t *testing.T, timeout time.Duration) (*faultproxy.Proxy, backend)
}{
	{"redis", startRedis},
	{"mysql", startMySQL},
}

// redisBackend talks to the shared test Redis through a proxy.
type redisBackend struct {
	rdb, direct *redis.Client
	name, key   string // the client's name, the key write sets
}

func startRedis(t *testing.T, timeout time.Duration) (*faultproxy.Proxy, backend) {
	direct := testenv.Redis(t, 0)
	p := faultproxy.Start(t, direct.Options().Addr)
	b := &redisBackend{direct: direct, name: testenv.Name("faultproxy"), key: testenv.Name("faultproxy:")}
	b.rdb = redisVia(t, p, &redis.Options{ClientName: b.name, ReadTimeout: timeout, WriteTimeout: timeout})
	t.Cleanup(func() { direct.Del(context.Background(), b.key) })
	return p, b
}

// redisVia returns a client of the proxy's upstream through the proxy. It
// never retries: go-redis retries a command that failed on the network,
// which would hide a fault and could run a write twice.
func redisVia(t *testing.T, p *faultproxy.Proxy, opt *redis.Options) *redis.Client {
	t.Helper()
	opt.Addr, opt.MaxRetries, opt.DialerRetries = p.Addr(), -1, 1
	if opt.DialTimeout == 0 {
		opt.DialTimeout = time.Second
	}
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

func (b *redisBackend) roundTrip(ctx context.Context) error { return b.rdb.Ping(ctx).Err() }

func (b *redisBackend) slow(ctx context.Context) error {
	err := b.rdb.BLPop(ctx, 3*time.Second, b.key).Err()
	if errors.Is(err, redis.Nil) {
		return nil // the timeout: nothing was pushed
	}
	return err
}

func (b *redisBackend) slowRunning(t *testing.T) bool {
	t.Helper()
	list, err := b.direct.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(list) {
		if strings.Contains(line, " name="+b.name+" ") && strings.Contains(line, " cmd=blpop ") {
			return true
		}
	}
	return false
}

func (b *redisBackend) write(ctx context.Context) error { return b.rdb.Set(ctx, b.key, 1, 0).Err() }

func (b *redisBackend) written(t *testing.T) bool {
	t.Helper()
	n, err := b.direct.Exists(context.Background(), b.key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// mysqlBackend talks to a fresh database of the shared test MariaDB
// through a proxy.
type mysqlBackend struct {
	db, direct *sql.DB
	marker     string // tells slow's query apart in the process list
	id         int64  // the row write inserts
}

func startMySQL(t *testing.T, timeout time.Duration) (*faultproxy.Proxy, backend) {
	dsn := testenv.EmptyMySQLDSN(t)
	direct := openMySQL(t, dsn)
	mustExec(t, direct, "CREATE TABLE t (id BIGINT PRIMARY KEY)")
	cfg, _ := mysql.ParseDSN(dsn)
	p := faultproxy.Start(t, cfg.Addr)
	b := &mysqlBackend{
		db:     openMySQL(t, mysqlVia(t, p, dsn, timeout)),
		direct: direct,
		marker: testenv.Name("slow"),
		id:     testenv.ID(),
	}
	return p, b
}

// mysqlVia returns dsn changed to go through the proxy, with timeout on
// every read and write (zero: none).
func mysqlVia(t *testing.T, p *faultproxy.Proxy, dsn string, timeout time.Duration) string {
	t.Helper()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Addr = p.Addr()
	cfg.Timeout, cfg.ReadTimeout, cfg.WriteTimeout = time.Second, timeout, timeout
	return cfg.FormatDSN()
}

func openMySQL(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(4)
	t.Cleanup(func() { db.Close() })
	return db
}

func (b *mysqlBackend) roundTrip(ctx context.Context) error { return b.db.PingContext(ctx) }

func (b *mysqlBackend) slow(ctx context.Context) error {
	// The marker is in the SQL text, not a parameter, so that the process
	// list shows it.
	var n, marker string
	return b.db.QueryRowContext(ctx, "SELECT SLEEP(3), '"+b.marker+"'").Scan(&n, &marker)
}

func (b *mysqlBackend) slowRunning(t *testing.T) bool {
	t.Helper()
	var n int
	err := b.direct.QueryRowContext(context.Background(),
		"SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE ? AND ID <> CONNECTION_ID()",
		"%"+b.marker+"%").Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n > 0
}

func (b *mysqlBackend) write(ctx context.Context) error {
	_, err := b.db.ExecContext(ctx, "INSERT INTO t VALUES (?)", b.id)
	return err
}

func (b *mysqlBackend) written(t *testing.T) bool {
	t.Helper()
	var n int
	if err := b.direct.QueryRowContext(context.Background(), "SELECT COUNT(*) FROM t WHERE id = ?", b.id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n == 1
}

func TestCut(t *testing.T) {
	for _, bk := range backends {
		t.Run(bk.name, func(t *testing.T) {
			// No read timeout: only the cut may end the slow request.
			p, b := bk.start(t, 0)
			ctx := context.Background()
			if err := b.roundTrip(ctx); err != nil {
				t.Fatalf("before the cut: %v", err)
			}

			slow := make(chan error, 1)
			go func() { slow <- b.slow(ctx) }()
			eventually(t, func() bool { return b.slowRunning(t) }, "the slow request runs")
			start := time.Now()
			p.Cut()
			select {
			case err := <-slow:
				if err == nil {
					t.Fatal("in-flight request succeeded across the cut")
				}
				if d := time.Since(start); d > 2*time.Second {
					t.Fatalf("in-flight request failed %v after the cut, not at once", d)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("in-flight request still waiting 5s after the cut")
			}
			if err := b.roundTrip(ctx); err == nil {
				t.Fatal("new request succeeded during the cut")
			}
			if st := p.Stats(); st.Refused == 0 || st.Open != 0 {
				t.Fatalf("stats during the cut: %+v, want refused connections and none open", st)
			}

			p.Heal()
			if err := b.roundTrip(ctx); err != nil {
				t.Fatalf("after heal: %v", err)
			}
		})
	}
}

func TestBlackhole(t *testing.T) {
	for _, bk := range backends {
		t.Run(bk.name, func(t *testing.T) {
			p, b := bk.start(t, timeout)
			ctx := context.Background()
			if err := roundTripAgain(ctx, b); err != nil {
				t.Fatalf("before the blackhole: %v", err)
			}

			p.Blackhole()
			start := time.Now()
			if err := b.roundTrip(ctx); err == nil {
				t.Fatal("request succeeded in the blackhole")
			}
			if d := time.Since(start); d < timeout {
				t.Fatalf("request failed after %v, before the client's timeout %v", d, timeout)
			}
			if err := b.write(ctx); err == nil {
				t.Fatal("write succeeded in the blackhole")
			}

			p.Heal()
			if err := roundTripAgain(ctx, b); err != nil {
				t.Fatalf("after heal: %v", err)
			}
			// The held write was dropped with its connection, not
			// delivered late.
			time.Sleep(50 * time.Millisecond)
			if b.written(t) {
				t.Fatal("write held by the blackhole reached the server after heal")
			}
		})
	}
}

// roundTripAgain is a round trip that must succeed on a client with the
// short blackhole timeout: a loaded machine can stall one past it, so it
// is tried three times. A proxy still holding the traffic fails them all.
func roundTripAgain(ctx context.Context, b backend) (err error) {
	for range 3 {
		if err = b.roundTrip(ctx); err == nil {
			return nil
		}
	}
	return err
}

func TestLatency(t *testing.T) {
	// Long enough that a round trip without it (one chunk each way, on
	// loopback) stays under d even on a loaded machine; latency left on in
	// either direction takes d or more.
	const d = 250 * time.Millisecond
	for _, bk := range backends {
		t.Run(bk.name, func(t *testing.T) {
			p, b := bk.start(t, 0)
			ctx := context.Background()
			if err := b.roundTrip(ctx); err != nil { // connect before timing
				t.Fatal(err)
			}
			p.Latency(d)
			start := time.Now()
			if err := b.roundTrip(ctx); err != nil {
				t.Fatal(err)
			}
			if got := time.Since(start); got < 2*d {
				t.Fatalf("round trip with latency %v each way took %v, want at least %v", d, got, 2*d)
			}
			p.Latency(0)
			start = time.Now()
			if err := b.roundTrip(ctx); err != nil {
				t.Fatal(err)
			}
			if got := time.Since(start); got >= d {
				t.Fatalf("round trip without latency took %v", got)
			}
		})
	}
}

func TestDropReplyAfterMySQL(t *testing.T) {
	tests := []struct {
		name  string
		match func([]byte) bool
		run   func(ctx context.Context, db *sql.DB) error // writes row 1, its reply dropped
	}{
		{"commit", faultproxy.MySQLQuery("COMMIT"), func(ctx context.Context, db *sql.DB) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return fmt.Errorf("begin: %w", err) // not the fault: the test fails
			}
			defer tx.Rollback()
			if _, err := tx.ExecContext(ctx, "INSERT INTO t VALUES (1)"); err != nil {
				return fmt.Errorf("insert: %w", err)
			}
			return tx.Commit()
		}},
		{"autocommit statement", faultproxy.MySQLQuery("insert into t"), func(ctx context.Context, db *sql.DB) error {
			_, err := db.ExecContext(ctx, "INSERT INTO t VALUES (1)")
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dsn := testenv.EmptyMySQLDSN(t)
			direct := openMySQL(t, dsn)
			mustExec(t, direct, "CREATE TABLE t (id BIGINT PRIMARY KEY)")
			cfg, _ := mysql.ParseDSN(dsn)
			p := faultproxy.Start(t, cfg.Addr)
			db := openMySQL(t, mysqlVia(t, p, dsn, 0))
			ctx := context.Background()
			if err := db.PingContext(ctx); err != nil {
				t.Fatal(err)
			}

			fired := p.DropReplyAfter(tt.match)
			err := tt.run(ctx, db)
			if err == nil {
				t.Fatal("got success, want an error: the reply was dropped")
			}
			within(t, fired, 5*time.Second, "the drop fired")
			var n int
			if err := direct.QueryRowContext(ctx, "SELECT COUNT(*) FROM t").Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 1 {
				t.Fatalf("rows on the server: %d, want 1: the request ran though its reply was dropped (client saw %v)", n, err)
			}
		})
	}
}

func TestDropReplyAfterRedis(t *testing.T) {
	const src = "return redis.call('INCR', KEYS[1])"
	script := redis.NewScript(src)
	tests := []struct {
		name  string
		match func(key string) func([]byte) bool
		run   func(ctx context.Context, rdb *redis.Client, key string) error // INCRs key
	}{
		{"command", func(key string) func([]byte) bool { return faultproxy.RedisCommand("incr", key) },
			func(ctx context.Context, rdb *redis.Client, key string) error {
				return rdb.Incr(ctx, key).Err()
			}},
		{"script", func(string) func([]byte) bool { return faultproxy.RedisScript(src) },
			func(ctx context.Context, rdb *redis.Client, key string) error {
				return script.Run(ctx, rdb, []string{key}).Err()
			}},
		{"pipeline", func(key string) func([]byte) bool { return faultproxy.RedisCommand("INCR", key) },
			func(ctx context.Context, rdb *redis.Client, key string) error {
				_, err := rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
					pipe.Get(ctx, key)
					pipe.Incr(ctx, key)
					pipe.Get(ctx, key)
					return nil
				})
				return err
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			direct := testenv.Redis(t, 0)
			key := testenv.Name("faultproxy:drop:")
			t.Cleanup(func() { direct.Del(context.Background(), key) })
			ctx := context.Background()
			// EVALSHA must find the script, or NOSCRIPT is what is dropped.
			if err := script.Load(ctx, direct).Err(); err != nil {
				t.Fatal(err)
			}
			p := faultproxy.Start(t, direct.Options().Addr)
			rdb := redisVia(t, p, &redis.Options{})
			if err := rdb.Ping(ctx).Err(); err != nil {
				t.Fatal(err)
			}

			fired := p.DropReplyAfter(tt.match(key))
			err := tt.run(ctx, rdb, key)
			if err == nil {
				t.Fatal("got success, want an error: the reply was dropped")
			}
			within(t, fired, 5*time.Second, "the drop fired")
			if n, err := direct.Get(ctx, key).Int(); err != nil || n != 1 {
				t.Fatalf("%s on the server: %d, %v; want 1: the command ran though its reply was dropped", key, n, err)
			}
			// The proxy is back to normal: the drop was one-shot.
			if err := rdb.Incr(ctx, key).Err(); err != nil {
				t.Fatalf("after the drop: %v", err)
			}
		})
	}
}

// TestDropReplyAfterWaitsForTheServer shows that the client's error comes
// only once the server has run the request: a test may check the server's
// state as soon as the client has failed. The request waits behind a
// DEBUG SLEEP sent just before it on the same connection, so a proxy that
// reset the connection right after forwarding would fail the client long
// before the server ran it.
//
// Nothing here races the clock: one connection runs its commands in
// order, so the server cannot run the INCR before it has slept, however
// slow the machine. (An earlier version slept on a connection of its own
// and sent the INCR once a probe's PING went unanswered for 50 ms: a
// loaded machine missed that timeout.)
func TestDropReplyAfterWaitsForTheServer(t *testing.T) {
	const busy = time.Second
	s := testenv.StartRedis(t, "--enable-debug-command", "yes")
	direct := s.Client(t)
	p := faultproxy.Start(t, s.Addr())
	rdb := redisVia(t, p, &redis.Options{ReadTimeout: 10 * busy})
	ctx := context.Background()
	if err := rdb.Ping(ctx).Err(); err != nil { // connect before timing
		t.Fatal(err)
	}

	// One pipeline, one Write, one chunk: the drop matches the INCR in it.
	fired := p.DropReplyAfter(faultproxy.RedisCommand("INCR", "k"))
	start := time.Now()
	_, err := rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.Do(ctx, "DEBUG", "SLEEP", busy.Seconds())
		pipe.Incr(ctx, "k")
		return nil
	})
	failed := time.Since(start)
	if err == nil {
		t.Fatal("got success, want an error: the reply was dropped")
	}
	within(t, fired, 5*time.Second, "the drop fired")
	if failed < busy {
		t.Fatalf("client failed %v after sending, before the server's %v sleep ended: before the server ran the request", failed, busy)
	}
	if n, err := direct.Get(ctx, "k").Int(); err != nil || n != 1 {
		t.Fatalf("k on the server: %d, %v; want 1", n, err)
	}
}

// TestManyConnections holds hundreds of connections through one proxy at
// once, cuts them all, and heals.
func TestManyConnections(t *testing.T) {
	const n = 300
	p := faultproxy.Start(t, testenv.RedisAddr(t))
	conns := make([]net.Conn, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range conns {
		wg.Go(func() {
			c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
			if err != nil {
				errs <- err
				return
			}
			conns[i] = c
			errs <- pingRaw(c)
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	})
	for range n {
		if err := <-errs; err != nil {
			t.Fatalf("ping through the proxy: %v", err)
		}
	}
	if st := p.Stats(); st.Open != n || st.Accepted != n {
		t.Fatalf("stats: %+v, want %d accepted and open", st, n)
	}

	p.Cut()
	for _, c := range conns {
		wg.Go(func() { errs <- pingRaw(c) })
	}
	wg.Wait()
	for range n {
		if err := <-errs; err == nil {
			t.Fatal("ping on a cut connection succeeded")
		}
	}
	eventually(t, func() bool { return p.Stats().Open == 0 }, "no connection open after the cut")

	p.Heal()
	c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := pingRaw(c); err != nil {
		t.Fatalf("after heal: %v", err)
	}
}

// TestClose shows that Close ends every connection, held or delayed, at
// once; TestMain checks that no goroutine is left.
func TestClose(t *testing.T) {
	p := faultproxy.Start(t, testenv.RedisAddr(t))
	p.Latency(time.Hour)
	delayed := dialRaw(t, p)
	if _, err := delayed.Write([]byte("PING\r\n")); err != nil {
		t.Fatal(err)
	}
	p.Blackhole()
	held := dialRaw(t, p)
	if _, err := held.Write([]byte("PING\r\n")); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() bool { return p.Stats().Open == 2 }, "both connections accepted")

	closed := make(chan struct{})
	go func() {
		p.Close()
		close(closed)
	}()
	within(t, closed, 2*time.Second, "Close returned")
	for _, c := range []net.Conn{delayed, held} {
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read from a connection of a closed proxy: %v, want EOF or reset", err)
		}
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		t.Fatal("dial of a closed proxy succeeded")
	}
}

func dialRaw(t *testing.T, p *faultproxy.Proxy) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// pingRaw sends Redis a PING on c and reads the PONG.
func pingRaw(c net.Conn) error {
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	buf := make([]byte, 7)
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != "+PONG\r\n" {
		return fmt.Errorf("PING: %q", buf)
	}
	return nil
}

func mustExec(t *testing.T, db *sql.DB, query string) {
	t.Helper()
	if _, err := db.ExecContext(context.Background(), query); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

// eventually fails t unless cond becomes true within 5s.
func eventually(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// within fails t unless ch is closed within d.
func within(t *testing.T, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("%s: not within %v", what, d)
	}
}
