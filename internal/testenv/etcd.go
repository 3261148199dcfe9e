package testenv

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// EtcdServer is a one-member etcd of the test's own (Debian's etcd-server
// package), with its data in a directory removed when the test ends.
type EtcdServer struct {
	bin  string
	dir  string
	port int
	peer int

	mu   sync.Mutex
	proc *process
}

// StartEtcd starts an etcd and kills it when the test ends. It is an
// integration test: skipped unless Enabled, and without etcd skipped, or
// failed when SECKILL_REQUIRE_INTEGRATION=1.
func StartEtcd(t testing.TB) *EtcdServer {
	t.Helper()
	s := &EtcdServer{bin: lookPath(t, "etcd"), dir: tempDir(t, "seckill-etcd-")}
	t.Cleanup(s.Kill)
	proc, port, err := startOnFreePort(s.start)
	if err != nil {
		t.Fatalf("start etcd: %v", err)
	}
	s.proc, s.port = proc, port
	return s
}

func (s *EtcdServer) start(port int) (*process, error) {
	peer, err := freePort()
	if err != nil {
		return nil, err
	}
	s.peer = peer
	client := "http://127.0.0.1:" + strconv.Itoa(port)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(peer)
	proc, err := startProcess(filepath.Join(s.dir, "etcd.log"), s.bin,
		"--name", "test", "--data-dir", filepath.Join(s.dir, "data"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "test="+peerURL, "--initial-cluster-state", "new",
		"--log-level", "warn")
	if err != nil {
		return nil, err
	}
	return proc, proc.waitReady(func() error {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{client}, DialTimeout: time.Second, Logger: quietZap()})
		if err != nil {
			return err
		}
		defer cli.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if _, err := cli.Get(ctx, "ping"); err != nil {
			return fmt.Errorf("etcd get: %w", err)
		}
		return nil
	})
}

// StartEtcdCluster starts an etcd cluster of n members (3 for a quorum
// that survives one loss), waits until it has a leader, and kills them all
// when the test ends.
func StartEtcdCluster(t testing.TB, n int) []*EtcdServer {
	t.Helper()
	bin := lookPath(t, "etcd")
	members := make([]*EtcdServer, n)
	var initial []string
	for i := range members {
		port, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		peer, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		members[i] = &EtcdServer{bin: bin, dir: tempDir(t, "seckill-etcd-"), port: port, peer: peer}
		t.Cleanup(members[i].Kill)
		initial = append(initial, fmt.Sprintf("m%d=http://127.0.0.1:%d", i, peer))
	}
	for i, m := range members {
		client := m.Endpoint()
		peerURL := "http://127.0.0.1:" + strconv.Itoa(m.peer)
		proc, err := startProcess(filepath.Join(m.dir, "etcd.log"), bin,
			"--name", fmt.Sprintf("m%d", i), "--data-dir", filepath.Join(m.dir, "data"),
			"--listen-client-urls", client, "--advertise-client-urls", client,
			"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
			"--heartbeat-interval", "50", "--election-timeout", "500", "--log-level", "warn")
		if err != nil {
			t.Fatalf("start etcd member %d: %v", i, err)
		}
		m.proc = proc
	}
	cli := EtcdClient(t, members...)
	deadline := time.Now().Add(startTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := cli.Get(ctx, "ping")
		cancel()
		if err == nil {
			return members
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcd cluster not ready: %v; log of member 0:\n%s", err, logTail(filepath.Join(members[0].dir, "etcd.log")))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// EtcdClient returns a client of all the given members, closed when the
// test ends.
func EtcdClient(t testing.TB, members ...*EtcdServer) *clientv3.Client {
	t.Helper()
	var endpoints []string
	for _, m := range members {
		endpoints = append(endpoints, m.Endpoint())
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 2 * time.Second, Logger: quietZap()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// IsLeader reports whether the member leads its cluster now.
func (s *EtcdServer) IsLeader(t testing.TB, cli *clientv3.Client) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, err := cli.Status(ctx, s.Endpoint())
	return err == nil && st.Leader == st.Header.MemberId
}

// Endpoint is the client URL.
func (s *EtcdServer) Endpoint() string { return "http://127.0.0.1:" + strconv.Itoa(s.port) }

// Addr is the client address, 127.0.0.1:port, for a faultproxy to forward to.
func (s *EtcdServer) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Client returns a client of the server, closed when the test ends.
func (s *EtcdServer) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint()}, DialTimeout: 2 * time.Second, Logger: quietZap()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// Kill stops the server at once (SIGKILL).
func (s *EtcdServer) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		s.proc.kill()
	}
}

// quietZap is a logger that drops everything: the etcd client logs its
// retries of a server still starting, or killed by the test, at length.
func quietZap() *zap.Logger { return zap.NewNop() }
