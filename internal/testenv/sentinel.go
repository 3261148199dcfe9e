package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/testenv/faultproxy"
)

// Sentinel is a Redis master with one replica, watched by three sentinels
// (quorum two), all processes of the test's own: the smallest set that
// fails over as production does. The sentinels call the master down after
// a second without an answer, so a test sees a failover within a few
// seconds of killing it.
type Sentinel struct {
	Name  string         // the master's name, for REDIS_MASTER_NAME
	Nodes []*RedisServer // the master and the replica, in either role
	// Link carries the replica's replication stream from the first
	// master: Blackhole it, and what the master writes meanwhile never
	// reaches the replica, as with a replica that lags.
	Link  *faultproxy.Proxy
	addrs []string // the sentinels'
}

// StartSentinel starts the set and waits until the sentinels know the
// master, its replica and each other: only then can they fail it over.
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	Integration(t, "Redis Sentinel: two redis-servers, three sentinels")
	// Without the delay a master waits five seconds for more replicas
	// before it sends the first one its data.
	master := StartRedis(t, "--repl-diskless-sync-delay", "0")
	link := faultproxy.Start(t, master.Addr())
	_, linkPort, _ := net.SplitHostPort(link.Addr())
	replica := StartRedis(t, "--replicaof", "127.0.0.1", linkPort, "--repl-diskless-sync-delay", "0")
	s := &Sentinel{Name: "seckill", Nodes: []*RedisServer{master, replica}, Link: link}
	bin := lookPath(t, "redis-server")
	for i := range 3 {
		dir := tempDir(t, "seckill-sentinel-")
		proc, port, err := startOnFreePort(func(port int) (*process, error) {
			// Sentinel rewrites its config file as it learns: it must be
			// a file of its own, writable.
			conf := filepath.Join(dir, "sentinel.conf")
			text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\n"+
				"sentinel monitor %s 127.0.0.1 %d 2\n"+
				"sentinel down-after-milliseconds %[3]s 1000\n"+
				"sentinel failover-timeout %[3]s 5000\n", port, dir, s.Name, master.port)
			if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
				return nil, err
			}
			proc, err := startProcess(filepath.Join(dir, "sentinel.log"), bin, conf, "--sentinel")
			if err != nil {
				return nil, err
			}
			addr := "127.0.0.1:" + strconv.Itoa(port)
			return proc, proc.waitReady(func() error { return ping(addr) })
		})
		if err != nil {
			t.Fatalf("start sentinel %d: %v", i, err)
		}
		t.Cleanup(proc.kill)
		s.addrs = append(s.addrs, "127.0.0.1:"+strconv.Itoa(port))
	}
	// The replica has the master's data, and sentinels find each other
	// and the replica through the master's hello channel, every two
	// seconds.
	deadline := time.Now().Add(30 * time.Second)
	rc := redis.NewClient(&redis.Options{Addr: replica.Addr()})
	for {
		info, _ := rc.Info(context.Background(), "replication").Result()
		if strings.Contains(info, "master_link_status:up") {
			break
		}
		if time.Now().After(deadline) {
			rc.Close()
			t.Fatalf("replica %s not in sync after 30 s:\n%s", replica.Addr(), info)
		}
		time.Sleep(50 * time.Millisecond)
	}
	rc.Close()
	for _, addr := range s.addrs {
		c := redis.NewSentinelClient(&redis.Options{Addr: addr})
		for {
			others, _ := c.Sentinels(context.Background(), s.Name).Result()
			replicas, _ := c.Replicas(context.Background(), s.Name).Result()
			if len(others) == 2 && len(replicas) == 1 {
				break
			}
			if time.Now().After(deadline) {
				c.Close()
				t.Fatalf("sentinel %s knows %d other sentinels and %d replicas after 30 s, want 2 and 1", addr, len(others), len(replicas))
			}
			time.Sleep(100 * time.Millisecond)
		}
		c.Close()
	}
	return s
}

// Addrs returns the sentinels' addresses, for REDIS_ADDRS.
func (s *Sentinel) Addrs() []string { return s.addrs }

// Master returns the node the sentinels name master now.
func (s *Sentinel) Master(t testing.TB) *RedisServer {
	t.Helper()
	var last error
	for _, addr := range s.addrs {
		c := redis.NewSentinelClient(&redis.Options{Addr: addr})
		hp, err := c.GetMasterAddrByName(context.Background(), s.Name).Result()
		c.Close()
		if err != nil {
			last = err
			continue
		}
		for _, n := range s.Nodes {
			if n.Addr() == hp[0]+":"+hp[1] {
				return n
			}
		}
		last = fmt.Errorf("sentinel %s names %v, none of the set's nodes", addr, hp)
	}
	t.Fatalf("ask the sentinels for the master: %v", last)
	return nil
}

// WaitFailover waits until the sentinels name a master other than old,
// and it answers as master.
func (s *Sentinel) WaitFailover(t testing.TB, old *RedisServer, within time.Duration) *RedisServer {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if m := s.Master(t); m != old {
			c := redis.NewClient(&redis.Options{Addr: m.Addr()})
			role, err := c.Do(context.Background(), "ROLE").Slice()
			c.Close()
			if err == nil && len(role) > 0 && role[0] == "master" {
				return m
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no failover away from %s within %s", old.Addr(), within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
