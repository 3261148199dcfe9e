package lock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/testenv"
)

func TestMain(m *testing.M) {
	// Every lock, waiter subscription and watchdog must be gone when the
	// tests are: a lock library that leaks goroutines leaks them per request.
	testenv.Main(m)
}

// integration skips t when what it needs is missing, or fails it when
// SECKILL_REQUIRE_INTEGRATION=1: then a missing server can never turn into
// a green run.
func integration(t testing.TB, missing string) {
	t.Helper()
	if os.Getenv("SECKILL_REQUIRE_INTEGRATION") == "1" {
		t.Fatalf("%s, and SECKILL_REQUIRE_INTEGRATION=1", missing)
	}
	t.Skipf("%s; skipping integration test", missing)
}

// testRedis returns a client of the Redis at SECKILL_TEST_REDIS_ADDR. Other
// packages' tests share that server: use keys from testKey, never flush.
func testRedis(t testing.TB) *redis.Client {
	t.Helper()
	addr := os.Getenv("SECKILL_TEST_REDIS_ADDR")
	if addr == "" {
		integration(t, "SECKILL_TEST_REDIS_ADDR is not set")
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { rdb.Close() })
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("redis at %s: %v", addr, err)
	}
	return rdb
}

// testKey returns a lock name no other test uses, and deletes what Redis
// stores for it from each of rdbs when the test ends.
func testKey(t testing.TB, rdbs ...redis.UniversalClient) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	key := "locktest:" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		k := keysFor(key)
		for _, rdb := range rdbs {
			rdb.Del(context.Background(), k.lock, k.fence)
		}
	})
	return key
}

// redisServer is a redis-server process of the test's own.
type redisServer struct {
	addr string
	cmd  *exec.Cmd
}

// startRedisServers starts n throwaway redis-server processes on free ports
// in 17000-17099, and stops them when the test ends.
func startRedisServers(t testing.TB, n int) []*redisServer {
	t.Helper()
	testenv.Integration(t, "redis-server")
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		integration(t, "redis-server is not on PATH")
	}
	var servers []*redisServer
	for port := 17000 + randInt(100); len(servers) < n; port++ {
		if port > 17099 {
			port = 17000
		}
		addr := "127.0.0.1:" + strconv.Itoa(port)
		if !portFree(addr) {
			continue
		}
		s := &redisServer{addr: addr, cmd: exec.Command(bin,
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no")}
		if err := s.cmd.Start(); err != nil {
			t.Fatalf("start redis-server on %s: %v", addr, err)
		}
		t.Cleanup(s.kill)
		if err := waitUp(addr); err != nil {
			s.kill()
			continue // lost a race for the port; take the next one
		}
		servers = append(servers, s)
	}
	return servers
}

// kill stops the server at once, as a crash would.
func (s *redisServer) kill() {
	if s.cmd.ProcessState != nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
}

// pause freezes the server (SIGSTOP) until resume: it keeps its
// connections but answers nothing, as a server stalled by swapping or a
// busy host would. kill still works on a paused server.
func (s *redisServer) pause(t testing.TB) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
}

func (s *redisServer) resume() { _ = s.cmd.Process.Signal(syscall.SIGCONT) }

func (s *redisServer) client(t testing.TB) *redis.Client {
	// No retries: a killed server should cost a RedLock attempt
	// milliseconds, as a crashed one would in production. A killed server
	// on loopback refuses the dial at once, so the dial timeout only has
	// to be long enough for a live server on a loaded machine (CI runs
	// every package's tests at once, with -race).
	rdb := redis.NewClient(&redis.Options{
		Addr: s.addr, MaxRetries: -1, DialerRetries: 1, DialTimeout: 2 * time.Second,
		ContextTimeoutEnabled: true, // as NewRedLock asks
	})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

func portFree(addr string) bool {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	l.Close()
	return true
}

func waitUp(addr string) error {
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer rdb.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := rdb.Ping(context.Background()).Err()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func randInt(n int) int {
	var b [2]byte
	_, _ = rand.Read(b[:])
	return (int(b[0])<<8 | int(b[1])) % n
}

// within fails t unless ch is closed within d.
func within(t *testing.T, d time.Duration, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("%s: not within %v", what, d)
	}
}

func mustObtain(t *testing.T, l Locker, key string, ttl time.Duration, opts ...Option) Lock {
	t.Helper()
	lk, err := l.Obtain(context.Background(), key, ttl, opts...)
	if err != nil {
		t.Fatalf("Obtain(%q): %v", key, err)
	}
	return lk
}

func mustRelease(t *testing.T, lk Lock) {
	t.Helper()
	if err := lk.Release(context.Background()); err != nil {
		t.Fatalf("Release(%q): %v", lk.Key(), err)
	}
}
