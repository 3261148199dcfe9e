package testenv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
)

// ZooKeeperServer is a standalone ZooKeeper of the test's own (Debian's
// zookeeper package), with a tick of 200 ms, so that sessions may time out
// in under a second, and its data in a directory removed when the test
// ends.
type ZooKeeperServer struct {
	script string
	dir    string
	port   int

	mu   sync.Mutex
	proc *process
}

// StartZooKeeper starts a ZooKeeper and kills it when the test ends.
// Without Debian's zookeeper package the test is skipped, or fails when
// SECKILL_REQUIRE_INTEGRATION=1.
func StartZooKeeper(t testing.TB) *ZooKeeperServer {
	t.Helper()
	const script = "/usr/share/zookeeper/bin/zkServer.sh"
	if _, err := os.Stat(script); err != nil {
		unavailable(t, "zookeeper is not installed ("+script+")")
	}
	lookPath(t, "java")
	s := &ZooKeeperServer{script: script, dir: tempDir(t, "seckill-zk-")}
	t.Cleanup(s.Kill)
	proc, port, err := startOnFreePort(s.start)
	if err != nil {
		t.Fatalf("start zookeeper: %v", err)
	}
	s.proc, s.port = proc, port
	return s
}

func (s *ZooKeeperServer) start(port int) (*process, error) {
	cfg := filepath.Join(s.dir, "zoo.cfg")
	conf := fmt.Sprintf("tickTime=200\ndataDir=%s\nclientPort=%d\nclientPortAddress=127.0.0.1\nadmin.enableServer=false\nmaxSessionTimeout=60000\n",
		filepath.Join(s.dir, "data"), port)
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	os.Setenv("ZOO_LOG_DIR", s.dir) // read by zkServer.sh; the same for every test's server
	proc, err := startProcess(filepath.Join(s.dir, "zookeeper.log"), s.script, "start-foreground", cfg)
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	return proc, proc.waitReady(func() error {
		conn, _, err := zk.Connect([]string{addr}, 2*time.Second, zk.WithLogInfo(false), zk.WithLogger(quietZK{}))
		if err != nil {
			return err
		}
		defer conn.Close()
		// A request waits for the session, which never comes from a server
		// still starting: bounded here.
		done := make(chan error, 1)
		go func() { _, _, err := conn.Exists("/"); done <- err }()
		select {
		case err := <-done:
			return err
		case <-time.After(2 * time.Second):
			return errors.New("no session within 2s")
		}
	})
}

// Addr is the client address, 127.0.0.1:port.
func (s *ZooKeeperServer) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Connect opens a session with timeout, closed when the test ends.
func (s *ZooKeeperServer) Connect(t testing.TB, timeout time.Duration) *zk.Conn {
	t.Helper()
	conn, _, err := zk.Connect([]string{s.Addr()}, timeout, zk.WithLogInfo(false), zk.WithLogger(quietZK{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	return conn
}

// Kill stops the server at once (SIGKILL).
func (s *ZooKeeperServer) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		s.proc.kill()
	}
}

// quietZK drops the zk client's log: it reports every reconnection.
type quietZK struct{}

func (quietZK) Printf(string, ...any) {}
