package testenv

import (
	"context"
	"fmt"
	"math"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a Redis Cluster of the test's own: three masters, each with
// one replica, made by redis-cli --cluster create as an operator would.
// Its nodes are RedisServers: kill one and its replica takes over after
// the node timeout (NodeTimeout).
type Cluster struct {
	nodes []*RedisServer
}

// NodeTimeout is how long the cluster waits for a silent master before its
// replica takes over: short, so that a failover test is quick.
const NodeTimeout = 1500 * time.Millisecond

// StartCluster starts six cluster-enabled redis-servers, makes them one
// cluster of three masters with a replica each, and waits until every
// slot is served and every replica is in sync. It is an integration test:
// skipped unless Enabled, and without redis-server and redis-cli skipped,
// or failed when SECKILL_REQUIRE_INTEGRATION=1.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	Integration(t, "a Redis Cluster of six redis-servers")
	cli := lookPath(t, "redis-cli")
	c := &Cluster{}
	args := []string{"create"}
	for range 6 {
		// The cluster bus listens on a port of its own, by default the
		// client port + 10000, which may be out of range or taken for a
		// free port picked at random: pick it too.
		bus, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		n := StartRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-port", strconv.Itoa(bus), "--cluster-node-timeout", strconv.Itoa(int(NodeTimeout.Milliseconds())),
			"--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0")
		c.nodes = append(c.nodes, n)
		args = append(args, n.Addr())
	}
	args = append([]string{"--cluster"}, append(args, "--cluster-replicas", "1", "--cluster-yes")...)
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	c.waitHealthy(t, 6, startTimeout)
	return c
}

// Addrs returns every node's address: what REDIS_ADDRS lists for a cluster.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// Client returns a cluster client, closed when the test ends. It reloads
// the slot map every second, so that it finds a promoted replica soon
// after a failover (go-redis' default is a minute).
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), MaxRetries: -1, DialTimeout: 2 * time.Second, ClusterStateReloadInterval: time.Second})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// Masters returns the nodes that are masters now.
func (c *Cluster) Masters(t testing.TB) []*RedisServer {
	t.Helper()
	var masters []*RedisServer
	for _, n := range c.nodes {
		if role, err := c.info(n, "replication"); err == nil && strings.Contains(role, "role:master") {
			masters = append(masters, n)
		}
	}
	return masters
}

// MasterOf returns the master serving key now.
func (c *Cluster) MasterOf(t testing.TB, key string) *RedisServer {
	t.Helper()
	rdb := c.Client(t)
	slot, err := rdb.ClusterKeySlot(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Masters(t) {
		r := n.Client(t)
		shards, err := r.ClusterShards(context.Background()).Result()
		if err != nil {
			continue
		}
		for _, sh := range shards {
			for _, s := range sh.Slots {
				if int64(s.Start) <= slot && slot <= int64(s.End) && masterIs(sh.Nodes, n.Addr()) {
					return n
				}
			}
		}
	}
	t.Fatalf("no master serves slot %d of %s", slot, key)
	return nil
}

// WaitFailover waits until the cluster serves every slot again with dead
// gone (its replica promoted), within the given time.
func (c *Cluster) WaitFailover(t testing.TB, dead *RedisServer, within time.Duration) {
	t.Helper()
	var live []*RedisServer
	for _, n := range c.nodes {
		if n != dead {
			live = append(live, n)
		}
	}
	(&Cluster{nodes: live}).waitHealthy(t, 0, within)
}

// waitHealthy waits until every node says the cluster is ok with all
// slots served and the masters number three, and, when nodes > 0, until
// the other nodes-3 are replicas in sync with their masters.
func (c *Cluster) waitHealthy(t testing.TB, nodes int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := c.healthy(nodes)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster not healthy after %s: %v", within, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *Cluster) healthy(nodes int) error {
	masters, synced := 0, 0
	for _, n := range c.nodes {
		cl, err := c.cmd(n, "CLUSTER", "INFO")
		if err != nil {
			return err
		}
		if !strings.Contains(cl, "cluster_state:ok") || !strings.Contains(cl, "cluster_slots_ok:16384") {
			return fmt.Errorf("%s: %s", n.Addr(), firstLines(cl, 3))
		}
		repl, err := c.info(n, "replication")
		if err != nil {
			return err
		}
		switch {
		case strings.Contains(repl, "role:master"):
			masters++
		case strings.Contains(repl, "master_link_status:up"):
			synced++
		}
	}
	if masters != 3 {
		return fmt.Errorf("%d masters, want 3", masters)
	}
	if nodes > 0 && synced != nodes-masters {
		return fmt.Errorf("%d replicas in sync, want %d", synced, nodes-masters)
	}
	return nil
}

func (c *Cluster) info(n *RedisServer, section string) (string, error) {
	return c.cmd(n, "INFO", section)
}

// cmd runs one command on node n on a connection of its own, so that a
// dead node fails fast and no pool is left behind.
func (c *Cluster) cmd(n *RedisServer, args ...any) (string, error) {
	rdb := redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second})
	defer rdb.Close()
	return rdb.Do(context.Background(), args...).Text()
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	return strings.Join(lines[:min(n, len(lines))], " ")
}

// Freeze stops the server's process (SIGSTOP) until Thaw: it keeps its
// connections but answers nothing, not even its replication link.
func (s *RedisServer) Freeze(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.proc.stop(); err != nil {
		t.Fatalf("freeze %s: %v", s.Addr(), err)
	}
}

// Thaw lets a frozen server run again.
func (s *RedisServer) Thaw(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.proc.cont(); err != nil {
		t.Fatalf("thaw %s: %v", s.Addr(), err)
	}
}

// ReplicaOf returns the node replicating master now.
func (c *Cluster) ReplicaOf(t testing.TB, master *RedisServer) *RedisServer {
	t.Helper()
	_, port, _ := strings.Cut(master.Addr(), ":")
	for _, n := range c.nodes {
		if repl, err := c.info(n, "replication"); err == nil && strings.Contains(repl, "master_port:"+port+"\r\n") {
			return n
		}
	}
	t.Fatalf("no replica of %s", master.Addr())
	return nil
}

// masterIs reports whether addr is the master among nodes, one shard's as
// CLUSTER SHARDS lists them.
func masterIs(nodes []redis.Node, addr string) bool {
	for _, nd := range nodes {
		if nd.Role == "master" && net.JoinHostPort(nd.IP, strconv.FormatInt(nd.Port, 10)) == addr {
			return true
		}
	}
	return false
}

// ResetStats zeroes every master's command statistics (CONFIG RESETSTAT),
// so that ScriptCalls counts from here.
func (c *Cluster) ResetStats(t testing.TB) {
	t.Helper()
	for _, m := range c.Masters(t) {
		if err := m.Client(t).ConfigResetStat(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// ScriptCalls reads each master's script calls (EVALSHA and EVAL) from
// INFO commandstats, by address: how the work of a sale spread over them.
func (c *Cluster) ScriptCalls(t testing.TB) map[string]int64 {
	t.Helper()
	calls := map[string]int64{}
	for _, m := range c.Masters(t) {
		calls[m.Addr()] = ScriptsIn(m.Client(t).Info(context.Background(), "commandstats").Val())
	}
	return calls
}

// EvenShares fails t unless each master's share of calls (ScriptCalls)
// lies within 5% of an even share, and logs them all.
func EvenShares(t testing.TB, calls map[string]int64) {
	t.Helper()
	var total int64
	for _, v := range calls {
		total += v
	}
	even := 1 / float64(len(calls))
	for addr, v := range calls {
		share := float64(v) / float64(total)
		t.Logf("%s: %d of %d scripts (%.1f%%)", addr, v, total, 100*share)
		if math.Abs(share-even) > 0.05*even {
			t.Errorf("master %s ran %.1f%% of the scripts, want %.1f%% ± 5%% of it", addr, 100*share, 100*even)
		}
	}
}

// ScriptsIn counts the scripts run (EVALSHA and EVAL calls) in the output
// of INFO commandstats.
func ScriptsIn(info string) int64 {
	var n int64
	for _, line := range strings.Split(info, "\n") {
		for _, cmd := range []string{"cmdstat_evalsha:calls=", "cmdstat_eval:calls="} {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), cmd); ok {
				var v int64
				fmt.Sscanf(rest, "%d", &v)
				n += v
			}
		}
	}
	return n
}
