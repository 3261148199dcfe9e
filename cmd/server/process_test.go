package main

import (
	"context"
	"database/sql"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/stock"
	"seckill/internal/testenv"
)

// These tests run the server as real child processes, because what they
// prove is about a process dying: a cancelled goroutine frees its
// connections politely, a SIGKILLed process does not.

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// serverBinary builds cmd/server once per test run. -trimpath, as the
// upgrade test builds the old version (oldServerBinary): built from a
// temporary directory, that one's packages are cached only if no path is
// in them, and the two builds then share the build cache's dependencies.
func serverBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "seckill-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "server")
		out, err := exec.Command("go", "build", "-trimpath", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = &buildError{err, string(out)}
		}
	})
	if buildErr != nil {
		t.Fatalf("build server: %v", buildErr)
	}
	return binPath
}

type buildError struct {
	err error
	out string
}

func (e *buildError) Error() string { return e.err.Error() + "\n" + e.out }

// proc is a server running as a child process.
type proc struct {
	Base string
	cmd  *exec.Cmd
	log  *syncBuffer
	done chan struct{}
	err  error
}

// spawn starts the server binary with env and waits until it is healthy.
func spawn(t *testing.T, env map[string]string) *proc {
	t.Helper()
	return spawnBinary(t, serverBinary(t), env, "/healthz")
}

// spawnBinary starts bin, a build of cmd/server (of another version, in
// the upgrade test), with env and waits until it answers 200 on path
// (/healthz: it runs; /readyz: MySQL and Redis answer it too).
func spawnBinary(t *testing.T, bin string, env map[string]string, path string) *proc {
	t.Helper()
	cmd := exec.Command(bin)
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	p := &proc{Base: "http://" + env["HTTP_ADDR"], cmd: cmd, log: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.log, p.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	died := make(chan error, 1)
	go func() {
		p.err = cmd.Wait()
		died <- p.err
		close(p.done)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("warnings and errors of process %s:\n%s", p.Base, problems(p.log.String()))
		}
	})
	waitAnswers(t, p.Base, path, died)
	return p
}

// lockVouchers takes a write lock on the vouchers table from a connection
// of the test's own, so that every order transaction stops at its UPDATE:
// requests pile up between taking stock in Redis and committing. It
// returns the function that lets them go.
func lockVouchers(t *testing.T, dsn string) (unlock func()) {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(context.Background(), "LOCK TABLES vouchers WRITE"); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	unlock = func() {
		once.Do(func() {
			conn.ExecContext(context.Background(), "UNLOCK TABLES")
			conn.Close()
			db.Close()
		})
	}
	t.Cleanup(unlock)
	return unlock
}

// A server process is killed with SIGKILL while it holds units taken in
// Redis whose orders are not committed. Every 200 ever sent is a row, and
// the units the dead process took are sold to newcomers within 30s.
func TestSIGKILLMidSale(t *testing.T) {
	st := newStack(t, 0)
	extra := []string{"STOCK_HOLD", "6s", "SWEEP_EVERY", "500ms"}
	victim := spawn(t, st.env(freeAddr(t), extra...))
	survivor := spawn(t, st.env(freeAddr(t), extra...))
	admin, _ := mustLogin(t, survivor.Base, adminPhone)
	const initial = 40
	vid := openVoucher(t, survivor.Base, admin, initial)
	users := loginMany(t, survivor.Base, 120)
	var l ledger

	// The sale starts on both instances.
	for i, u := range users[:10] {
		base := []string{victim.Base, survivor.Base}[i%2]
		if o := buy(&l, base, u, vid); o.Status != http.StatusOK {
			t.Fatalf("warm-up purchase: %+v", o)
		}
	}

	// Requests to the victim take stock in Redis, then wait on MySQL.
	unlock := lockVouchers(t, st.DSN)
	var inflight sync.WaitGroup
	for _, u := range users[10:30] {
		inflight.Go(func() { buy(&l, victim.Base, u, vid) })
	}
	db, rdb := testenv.Open(t, st.DSN), testenv.Redis(t, st.RedisDB)
	waitFor(t, 5*time.Second, "holds of the in-flight requests", func() bool {
		return readHolds(rdb, vid) == 20
	})
	if err := victim.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-victim.done
	killed := time.Now()
	unlock()
	inflight.Wait()

	// Newcomers hammer the survivor until everything is sold.
	for _, u := range users[30:] {
		for time.Since(killed) < 30*time.Second {
			o := buy(&l, survivor.Base, u, vid)
			if o.Status == http.StatusOK || o.Code == "already_ordered" {
				break
			}
			if len(readState(t, db, rdb, vid).Orders) == initial {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if len(readState(t, db, rdb, vid).Orders) == initial {
			break
		}
	}
	took := time.Since(killed)
	s := waitRest(t, db, rdb, vid, 5*time.Second)
	checkInvariants(t, s, initial, l.wins(t))
	if len(s.Orders) != initial {
		t.Fatalf("%d of %d units sold %s after the kill: the dead process's units were not given back", len(s.Orders), initial, took.Round(time.Second))
	}
	if took > 30*time.Second {
		t.Errorf("the dead process's units were sold again only after %s, want within 30s", took)
	}
	t.Logf("all %d units sold %s after SIGKILL", initial, took.Round(100*time.Millisecond))
}

// SIGTERM while requests are in flight: the server stops accepting, lets
// them finish (they answer 200, with their rows), and exits cleanly.
func TestSIGTERMMidSale(t *testing.T) {
	st := newStack(t, 0)
	p := spawn(t, st.env(freeAddr(t)))
	admin, _ := mustLogin(t, p.Base, adminPhone)
	const initial = 50
	vid := openVoucher(t, p.Base, admin, initial)
	users := loginMany(t, p.Base, 30)
	db, rdb := testenv.Open(t, st.DSN), testenv.Redis(t, st.RedisDB)

	unlock := lockVouchers(t, st.DSN)
	var l ledger
	var inflight sync.WaitGroup
	for _, u := range users {
		inflight.Go(func() { buy(&l, p.Base, u, vid) })
	}
	waitFor(t, 5*time.Second, "requests in flight", func() bool { return readHolds(rdb, vid) == int64(len(users)) })
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The locked table keeps the requests in flight, and the drain open,
	// for as long as this takes: a server that goes on accepting answers
	// /healthz throughout.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := call("GET", p.Base+"/healthz", "", nil); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("the server still accepts new connections 5s after SIGTERM")
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	l.mu.Lock()
	answered := len(l.all)
	l.mu.Unlock()
	if answered != 0 {
		t.Errorf("%d in-flight requests answered before the unlock: the drain was over, the refusal proves nothing", answered)
	}
	unlock()
	inflight.Wait()
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the server did not exit within 30s of SIGTERM")
	}
	if p.err != nil {
		t.Errorf("exit after SIGTERM: %v, want status 0", p.err)
	}
	onlyExpected(t, &l)
	won := l.wins(t)
	if len(won) != len(users) {
		t.Errorf("%d of %d in-flight requests answered 200", len(won), len(users))
	}
	s := readState(t, db, rdb, vid)
	checkInvariants(t, s, initial, won)
	if s.Holds != 0 {
		t.Errorf("%d holds left open after a clean shutdown", s.Holds)
	}
}

func readHolds(rdb *redis.Client, vid string) int64 {
	id, _ := strconv.ParseInt(vid, 10, 64)
	return rdb.ZCard(context.Background(), stock.KeysOf(id).Holds).Val()
}

// waitFor polls cond until it holds or within passes.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
