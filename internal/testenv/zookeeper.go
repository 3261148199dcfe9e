package testenv

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
)

// ZooKeeperServer is a standalone ZooKeeper of the test's own (Debian's
// zookeeper package), with a tick of 200 ms, so that sessions may time out
// in under a second, empty container nodes removed within 100 ms, and its
// data in a directory removed when the test ends.
type ZooKeeperServer struct {
	script string
	dir    string
	port   int

	mu   sync.Mutex
	proc *process
}

// containerCheck makes the server look for empty container nodes every
// 100 ms instead of every minute, so that a test sees a lock's directory go
// soon after its last node. It is a Java system property, not a zoo.cfg
// setting: zkServer.sh passes SERVER_JVMFLAGS to the JVM.
const containerCheck = "-Dznode.container.checkIntervalMs=100"

// StartZooKeeper starts a ZooKeeper and kills it when the test ends. It is
// an integration test: skipped unless Enabled, and without Debian's
// zookeeper package skipped, or failed when SECKILL_REQUIRE_INTEGRATION=1.
func StartZooKeeper(t testing.TB) *ZooKeeperServer {
	t.Helper()
	const script = "/usr/share/zookeeper/bin/zkServer.sh"
	Integration(t, "ZooKeeper")
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
	os.Setenv("SERVER_JVMFLAGS", containerCheck)
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

// StartZooKeeperEnsemble starts n ZooKeeper servers as one ensemble (3
// for a quorum that survives one loss), waits until it serves, and kills
// them all when the test ends.
func StartZooKeeperEnsemble(t testing.TB, n int) []*ZooKeeperServer {
	t.Helper()
	const script = "/usr/share/zookeeper/bin/zkServer.sh"
	Integration(t, "ZooKeeper")
	if _, err := os.Stat(script); err != nil {
		unavailable(t, "zookeeper is not installed ("+script+")")
	}
	lookPath(t, "java")
	servers := make([]*ZooKeeperServer, n)
	var peers strings.Builder
	for i := range servers {
		ports := make([]int, 3)
		for j := range ports {
			p, err := freePort()
			if err != nil {
				t.Fatal(err)
			}
			ports[j] = p
		}
		servers[i] = &ZooKeeperServer{script: script, dir: tempDir(t, "seckill-zk-"), port: ports[0]}
		t.Cleanup(servers[i].Kill)
		fmt.Fprintf(&peers, "server.%d=127.0.0.1:%d:%d\n", i+1, ports[1], ports[2])
	}
	for i, s := range servers {
		data := filepath.Join(s.dir, "data")
		if err := os.MkdirAll(data, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(data, "myid"), []byte(strconv.Itoa(i+1)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		cfg := filepath.Join(s.dir, "zoo.cfg")
		conf := fmt.Sprintf("tickTime=200\ninitLimit=25\nsyncLimit=10\ndataDir=%s\nclientPort=%d\nclientPortAddress=127.0.0.1\nadmin.enableServer=false\nmaxSessionTimeout=60000\n4lw.commands.whitelist=srvr\n%s",
			data, s.port, peers.String())
		if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		os.Setenv("ZOO_LOG_DIR", s.dir)
		os.Setenv("SERVER_JVMFLAGS", containerCheck)
		proc, err := startProcess(filepath.Join(s.dir, "zookeeper.log"), script, "start-foreground", cfg)
		if err != nil {
			t.Fatalf("start zookeeper %d: %v", i+1, err)
		}
		s.proc = proc
	}
	deadline := time.Now().Add(2 * startTimeout)
	for _, s := range servers {
		for s.Mode() == "" {
			if time.Now().After(deadline) {
				t.Fatalf("zookeeper ensemble not serving; log of %s:\n%s", s.Addr(), logTail(filepath.Join(s.dir, "zookeeper.log")))
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	return servers
}

// Mode asks the server (the four-letter word srvr) whether it is the
// ensemble's "leader" or a "follower"; "" while it serves no clients.
func (s *ZooKeeperServer) Mode() string {
	c, err := net.DialTimeout("tcp", s.Addr(), time.Second)
	if err != nil {
		return ""
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("srvr")); err != nil {
		return ""
	}
	out, _ := io.ReadAll(c)
	for _, line := range strings.Split(string(out), "\n") {
		if mode, ok := strings.CutPrefix(line, "Mode: "); ok {
			return strings.TrimSpace(mode)
		}
	}
	return ""
}

// ZooKeeperAddrs lists the servers' client addresses.
func ZooKeeperAddrs(servers []*ZooKeeperServer) []string {
	var addrs []string
	for _, s := range servers {
		addrs = append(addrs, s.Addr())
	}
	return addrs
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
