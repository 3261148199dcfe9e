package testenv

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
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

// StartEtcd starts an etcd and kills it when the test ends. Without etcd
// the test is skipped, or fails when SECKILL_REQUIRE_INTEGRATION=1.
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

// Endpoint is the client URL.
func (s *EtcdServer) Endpoint() string { return "http://127.0.0.1:" + strconv.Itoa(s.port) }

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
