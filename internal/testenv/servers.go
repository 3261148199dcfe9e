package testenv

import (
	"bufio"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
)

// The servers below are processes of the test's own, for tests that must
// not touch the shared ones: tests that kill a server, restart it, or make
// it read-only would break every other package's tests running at the same
// time. Each runs on a free port on 127.0.0.1 with a data directory of its
// own, and is killed and removed when the test ends.

// startTimeout bounds a server's start. MariaDB is ready in about a second
// on an idle machine; CI runs every package's tests at once under -race.
const startTimeout = 30 * time.Second

// MariaDB is a mariadbd process of the test's own. Its root user has an
// empty password and every privilege, which makes it bypass read_only: see
// CreateUser and SetReadOnly. Its methods are safe to call from any
// goroutine.
type MariaDB struct {
	bin  string
	dir  string
	args []string // all but --port
	port int

	mu   sync.Mutex
	proc *process
}

// StartMariaDB starts a fresh MariaDB server, with args added to its
// command line, and kills it when the test ends. It is an integration
// test: skipped unless Enabled, and without mariadbd and
// mariadb-install-db skipped, or failed when SECKILL_REQUIRE_INTEGRATION=1.
func StartMariaDB(t testing.TB, args ...string) *MariaDB {
	t.Helper()
	bin := lookPath(t, "mariadbd")
	installDB := lookPath(t, "mariadb-install-db")
	start := time.Now()
	dir := tempDir(t, "seckill-mariadb-")

	// Small and quick rather than fast: a test server holds a few rows.
	// Temporary files go to dir, not /tmp: servers bootstrapping at the
	// same time were seen to trip over each other's temporary tables there.
	// Native AIO is off because io_uring and libaio are often refused in
	// containers, where CI runs. mariadbd refuses to run as root unless
	// told to.
	common := []string{
		"--no-defaults", // first, or it is ignored: no /etc/mysql config
		"--datadir=" + filepath.Join(dir, "data"),
		"--tmpdir=" + dir,
		"--innodb-buffer-pool-size=32M",
		"--innodb-log-file-size=8M",
		"--innodb-use-native-aio=OFF",
		"--skip-name-resolve",
	}
	if os.Geteuid() == 0 {
		common = append(common, "--user=root")
	}
	install := exec.Command(installDB, slices.Concat(common, []string{
		"--auth-root-authentication-method=normal", // root, empty password
		"--skip-test-db",
	})...)
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("mariadb-install-db: %v\n%s", err, out)
	}

	m := &MariaDB{bin: bin, dir: dir, args: slices.Concat(common, []string{
		"--bind-address=127.0.0.1",
		// The socket path must fit in 108 bytes: dir is short.
		"--socket=" + filepath.Join(dir, "mariadb.sock"),
		"--pid-file=" + filepath.Join(dir, "mariadb.pid"),
		"--log-error=" + filepath.Join(dir, "error.log"),
	}, args)}
	t.Cleanup(m.Kill)
	proc, port, err := startOnFreePort(m.start)
	if err != nil {
		t.Fatalf("start mariadbd: %v", err)
	}
	m.proc, m.port = proc, port
	t.Logf("mariadbd on %s ready in %v", m.Addr(), time.Since(start).Round(time.Millisecond))
	return m
}

// start runs mariadbd on port and waits until it answers.
func (m *MariaDB) start(port int) (*process, error) {
	args := append(slices.Clone(m.args), "--port="+strconv.Itoa(port))
	proc, err := startProcess(filepath.Join(m.dir, "error.log"), m.bin, args...)
	if err != nil {
		return nil, err
	}
	cfg := m.config(port, "root", "", "")
	cfg.Timeout = time.Second
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		proc.kill()
		return nil, err
	}
	defer db.Close()
	return proc, proc.waitReady(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return db.PingContext(ctx)
	})
}

// Addr returns the server's address, 127.0.0.1:port.
func (m *MariaDB) Addr() string { return "127.0.0.1:" + strconv.Itoa(m.port) }

// DSN returns root's DSN for database db ("" for none), with parseTime=true
// and loc=UTC like the rest of testenv.
func (m *MariaDB) DSN(db string) string { return m.config(m.port, "root", "", db).FormatDSN() }

func (m *MariaDB) config(port int, user, password, db string) *mysql.Config {
	cfg := mysql.NewConfig()
	cfg.User, cfg.Passwd, cfg.DBName = user, password, db
	cfg.Net, cfg.Addr = "tcp", "127.0.0.1:"+strconv.Itoa(port)
	cfg.ParseTime, cfg.Loc = true, time.UTC
	return cfg
}

// Exec runs query as root, and fails the test if it fails.
func (m *MariaDB) Exec(t testing.TB, query string, args ...any) {
	t.Helper()
	db, err := sql.Open("mysql", m.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(context.Background(), query, args...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

// identifier is what CreateUser accepts as a user or database name: it
// builds SQL from them.
var identifier = regexp.MustCompile(`^[A-Za-z0-9_]{1,32}$`)

// CreateUser creates database db (unless it exists) and a user name with
// every privilege on db and none elsewhere, and returns that user's DSN for
// db. That is how the service runs in production, and it matters in tests:
// root has SUPER and READ ONLY ADMIN, which bypass read_only, so only such a
// user sees what SetReadOnly does.
func (m *MariaDB) CreateUser(t testing.TB, name, db string) string {
	t.Helper()
	if !identifier.MatchString(name) || !identifier.MatchString(db) {
		t.Fatalf("CreateUser(%q, %q): names must match %s", name, db, identifier)
	}
	b := make([]byte, 8)
	rand.Read(b)
	password := hex.EncodeToString(b)
	m.Exec(t, "CREATE DATABASE IF NOT EXISTS `"+db+"`")
	m.Exec(t, "CREATE USER '"+name+"'@'%' IDENTIFIED BY '"+password+"'")
	m.Exec(t, "GRANT ALL PRIVILEGES ON `"+db+"`.* TO '"+name+"'@'%'")
	return m.config(m.port, name, password, db).FormatDSN()
}

// SetReadOnly turns the server's read_only on or off, as a failover does to
// an old primary. From then on a write by a user without READ ONLY ADMIN
// (one from CreateUser, not root) fails with error 1290
// (ER_OPTION_PREVENTS_STATEMENT), also on connections already open.
func (m *MariaDB) SetReadOnly(t testing.TB, on bool) {
	t.Helper()
	m.Exec(t, "SET GLOBAL read_only = ?", on)
}

// Kill stops the server at once (SIGKILL), as a crash would. Committed data
// survives: InnoDB recovers it at Restart.
func (m *MariaDB) Kill() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proc != nil {
		m.proc.kill()
	}
}

// Restart kills the server if it runs, starts it again on the same port
// with the same data, and waits until it answers.
func (m *MariaDB) Restart(t testing.TB) {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proc != nil {
		m.proc.kill()
	}
	proc, err := m.start(m.port)
	if err != nil {
		t.Fatalf("restart mariadbd on %s: %v", m.Addr(), err)
	}
	m.proc = proc
}

// RedisServer is a redis-server process of the test's own, which saves
// nothing: after Kill and Restart it is empty, as a cache node that lost its
// memory. Its methods are safe to call from any goroutine.
type RedisServer struct {
	bin  string
	dir  string
	args []string
	port int

	mu   sync.Mutex
	proc *process
}

// StartRedis starts an empty redis-server, with args added to its command
// line (e.g. "--maxmemory", "1mb"), and kills it when the test ends. It
// is an integration test: skipped unless Enabled, and without
// redis-server skipped, or failed when SECKILL_REQUIRE_INTEGRATION=1.
func StartRedis(t testing.TB, args ...string) *RedisServer {
	t.Helper()
	s := &RedisServer{bin: lookPath(t, "redis-server"), dir: tempDir(t, "seckill-redis-"), args: args}
	t.Cleanup(s.Kill)
	proc, port, err := startOnFreePort(s.start)
	if err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	s.proc, s.port = proc, port
	return s
}

// start runs redis-server on port and waits until it answers PING.
func (s *RedisServer) start(port int) (*process, error) {
	args := append([]string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir,
	}, s.args...)
	proc, err := startProcess(filepath.Join(s.dir, "redis.log"), s.bin, args...)
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	return proc, proc.waitReady(func() error { return ping(addr) })
}

// ping sends PING to the Redis at addr on a connection of its own, so that
// no client pool logs the failed dials of a server still starting.
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	// A server that asks who is calling is up too.
	if line != "+PONG\r\n" && !strings.HasPrefix(line, "-NOAUTH ") {
		return fmt.Errorf("PING: %q", line)
	}
	return nil
}

// Addr returns the server's address, 127.0.0.1:port.
func (s *RedisServer) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Client returns a client of the server, closed when the test ends. It
// never retries: go-redis retries a command that failed on the network by
// default, which would hide a killed server and could run a write twice.
// A killed server refuses the dial at once on loopback, so the dial timeout
// only has to be long enough for a live server on a loaded machine.
func (s *RedisServer) Client(t testing.TB) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{
		Addr: s.Addr(), MaxRetries: -1, DialerRetries: 1, DialTimeout: 2 * time.Second,
	})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// Kill stops the server at once (SIGKILL), as a crash would; its data is
// gone.
func (s *RedisServer) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		s.proc.kill()
	}
}

// Restart kills the server if it runs and starts it again, empty, on the
// same port, so clients and proxies pointed at Addr reach it again.
func (s *RedisServer) Restart(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		s.proc.kill()
	}
	proc, err := s.start(s.port)
	if err != nil {
		t.Fatalf("restart redis-server on %s: %v", s.Addr(), err)
	}
	s.proc = proc
}

// process is a running server and the log file of its output.
type process struct {
	cmd    *exec.Cmd
	log    string
	exited chan struct{} // closed once it has exited and been waited for
}

func startProcess(log, bin string, args ...string) (*process, error) {
	f, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", bin, err)
	}
	p := &process{cmd: cmd, log: log, exited: make(chan struct{})}
	go func() {
		cmd.Wait()
		f.Close()
		close(p.exited)
	}()
	return p, nil
}

// kill kills the process, if it still runs, and waits for it.
func (p *process) kill() {
	p.cmd.Process.Kill()
	<-p.exited
}

// waitReady polls ready until it succeeds, and kills the process if it does
// not within startTimeout. When the process exits first (a port taken since
// it was found free, a bad flag), the error holds the end of its log.
func (p *process) waitReady(ready func() error) error {
	return p.waitReadyWithin(startTimeout, ready)
}

// waitReadyWithin is waitReady with a time of its own: a Galera node that
// joins answers only after its state transfer.
func (p *process) waitReadyWithin(within time.Duration, ready func() error) error {
	deadline := time.Now().Add(within)
	for {
		err := ready()
		if err == nil {
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("%w; log:\n%s", errExited, logTail(p.log))
		default:
		}
		if time.Now().After(deadline) {
			p.kill()
			return fmt.Errorf("not ready after %v: %v; log:\n%s", within, err, logTail(p.log))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var errExited = errors.New("exited before it was ready")

// startOnFreePort starts a server on a port that was free a moment ago. The
// port may be taken in between by anything else on the machine, then the
// server exits, and another port is tried.
func startOnFreePort(start func(port int) (*process, error)) (*process, int, error) {
	var err error
	for range 3 {
		var port int
		if port, err = freePort(); err != nil {
			return nil, 0, err
		}
		var proc *process
		if proc, err = start(port); err == nil {
			return proc, port, nil
		}
		if !errors.Is(err, errExited) {
			break
		}
	}
	return nil, 0, err
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// logTail returns the last lines of the log at path.
func logTail(path string) string {
	b, _ := os.ReadFile(path)
	const max = 2000
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}

// lookPath finds a server binary on PATH or in the sbin directories, which
// are not on every user's PATH; it skips or fails the test without one.
// It is where every Start function begins, so it first skips the test
// unless integration tests are on: an installed binary is not a reason to
// start it in a run of unit tests.
func lookPath(t testing.TB, name string) string {
	t.Helper()
	Integration(t, name)
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, dir := range []string{"/usr/sbin", "/usr/local/sbin", "/sbin"} {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	unavailable(t, name+" is not installed")
	return ""
}

// tempDir makes a directory removed when the test ends. It is not
// t.TempDir: that path holds the test's name and can be too long for a
// Unix socket (108 bytes).
func tempDir(t testing.TB, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
