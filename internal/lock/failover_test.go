package lock

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/redis/go-redis/v9"

	"seckill/internal/testenv"
)

// A lock on a consensus store survives the loss of the store's leader: the
// holder still holds it (a renewal succeeds once the survivors have
// elected a new leader), another client is refused until the holder
// releases it, and the next holder's fencing token is greater. A Redis
// master with a replica does not keep this promise: a lock the replica had
// not received is gone after the failover (cmd/lab, experiment 12).
func TestLockSurvivesLeaderLoss(t *testing.T) {
	ctx := context.Background()
	// check runs the scenario on a store whose leader kill() stops, with a
	// holder's and a newcomer's Locker.
	check := func(t *testing.T, holder Locker, kill func(), newcomer func() Locker) {
		key := testKey(t)
		lk, err := holder.Obtain(ctx, key, 10*time.Second, WithFencing())
		if err != nil {
			t.Fatal(err)
		}
		kill()
		killed := time.Now()
		for {
			ectx, cancel := context.WithTimeout(ctx, time.Second)
			err := lk.Extend(ectx, 10*time.Second)
			cancel()
			if err == nil {
				break
			}
			if errors.Is(err, ErrNotHeld) {
				t.Fatalf("the lock was lost with the leader: %v", err)
			}
			if time.Since(killed) > 20*time.Second {
				t.Fatalf("no renewal succeeded within 20 s of the leader's death: %v", err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Logf("the holder renewed its lock %v after the leader died", time.Since(killed).Round(time.Millisecond))
		// The newcomer asks until the store answers (a write waits for the
		// new leader: ZooKeeper serves a read from any follower, so the
		// holder's renewal may succeed before a write can): the answer
		// must be no.
		other := newcomer()
		for {
			_, err := other.Obtain(ctx, key, 10*time.Second)
			if errors.Is(err, ErrNotAcquired) {
				break
			}
			if err == nil {
				t.Fatal("a newcomer got the lock after the failover while its holder held it")
			}
			if time.Since(killed) > 20*time.Second {
				t.Fatalf("a newcomer after the failover: %v, want ErrNotAcquired", err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		mustRelease(t, lk)
		next, err := other.Obtain(ctx, key, 10*time.Second, WithFencing())
		if err != nil {
			t.Fatal(err)
		}
		if next.Fence() <= lk.Fence() {
			t.Errorf("fence %d after the failover, not above the holder's %d", next.Fence(), lk.Fence())
		}
		mustRelease(t, next)
	}

	t.Run("etcd", func(t *testing.T) {
		members := testenv.StartEtcdCluster(t, 3)
		cli := testenv.EtcdClient(t, members...)
		var leader *testenv.EtcdServer
		var survivors []*testenv.EtcdServer
		for _, m := range members {
			if leader == nil && m.IsLeader(t, cli) {
				leader = m
			} else {
				survivors = append(survivors, m)
			}
		}
		if leader == nil {
			t.Fatal("no leader")
		}
		check(t, NewEtcd(cli), leader.Kill, func() Locker { return NewEtcd(testenv.EtcdClient(t, survivors...)) })
	})

	t.Run("zookeeper", func(t *testing.T) {
		servers := testenv.StartZooKeeperEnsemble(t, 3)
		// A session outlives the election (a few seconds at most with a
		// 200 ms tick): the holder's session moves to a survivor, and the
		// holder, which trusts its lock no longer than the session lasts
		// unconfirmed, renews it in time.
		const session = 8 * time.Second
		connect := func(addrs []string) *ZooKeeper {
			conn, _, err := zk.Connect(addrs, session, zk.WithLogInfo(false), zk.WithLogger(quiet{}))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(conn.Close)
			return NewZooKeeper(conn).WithSessionTimeout(session)
		}
		var leader *testenv.ZooKeeperServer
		var survivors []*testenv.ZooKeeperServer
		for _, s := range servers {
			if leader == nil && s.Mode() == "leader" {
				leader = s
			} else {
				survivors = append(survivors, s)
			}
		}
		if leader == nil {
			t.Fatal("no leader")
		}
		check(t, connect(testenv.ZooKeeperAddrs(servers)), leader.Kill,
			func() Locker { return connect(testenv.ZooKeeperAddrs(survivors)) })
	})
}

// Many clients' histories stay linearizable against a mutex through each
// backend's own kind of failure, struck a third of the way in, and every
// key can be taken at the end (linearizable_test.go): nothing the failure
// cut short is left behind. Eight clients on two keys, 44 Obtain calls
// each, half of them try-once; the servers are the test's own.
func TestLinearizableThroughFailover(t *testing.T) {
	const clients, ops = 8, 44
	// third waits until a third of the calls have returned.
	third := func(h *history) {
		for h.done.Load() < clients*ops/3 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	// ghost bounds how long what a failed call took may remain (see
	// historyRun).
	run := func(t *testing.T, lockers []Locker, ttl, ghost time.Duration, fault func(h *history)) {
		checkLinearizable(t, historyRun{
			lockers: lockers, keys: []string{testKey(t), testKey(t)},
			ops: ops, ttl: ttl, ghost: ghost, fault: fault,
		})
	}

	t.Run("zookeeper", func(t *testing.T) {
		// The leader of three servers is killed: sessions move to the
		// survivors (8 s is ample for the election), and every node a
		// call left behind must be removed by its client.
		servers := testenv.StartZooKeeperEnsemble(t, 3)
		const session = 8 * time.Second
		lockers := make([]Locker, clients)
		for i := range lockers {
			conn, _, err := zk.Connect(testenv.ZooKeeperAddrs(servers), session, zk.WithLogInfo(false), zk.WithLogger(quiet{}))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(conn.Close)
			lockers[i] = NewZooKeeper(conn).WithSessionTimeout(session)
		}
		// A call cut short by the election removes what it made once
		// its client is connected again: within seconds, but a loaded
		// machine may take the session timeout to elect a leader.
		run(t, lockers, 3*time.Second, session, func(h *history) {
			third(h)
			for _, s := range servers {
				if s.Mode() == "leader" {
					t.Logf("killing the leader %s at %v", s.Addr(), time.Duration(h.now()).Round(time.Millisecond))
					s.Kill()
					return
				}
			}
			t.Error("no leader to kill")
		})
	})

	t.Run("etcd", func(t *testing.T) {
		members := testenv.StartEtcdCluster(t, 3)
		lockers := make([]Locker, clients)
		for i := range lockers {
			lockers[i] = NewEtcd(testenv.EtcdClient(t, members...))
		}
		admin := testenv.EtcdClient(t, members...)
		// What a call cut short took is bound to its lease, which it
		// revokes (giving up after 5 s), or which runs out: 3 s after
		// the last keepalive, counted again from the election.
		run(t, lockers, 3*time.Second, 8*time.Second, func(h *history) {
			third(h)
			for _, m := range members {
				if m.IsLeader(t, admin) {
					t.Logf("killing the leader %s at %v", m.Endpoint(), time.Duration(h.now()).Round(time.Millisecond))
					m.Kill()
					return
				}
			}
			t.Error("no leader to kill")
		})
	})

	t.Run("mysql", func(t *testing.T) {
		// A holder's session is killed (as a failover of MySQL, or an
		// operator, ends it): its lock is free at once, and the holder
		// learns it at its Release (ErrNotHeld).
		db := testMySQLPool(t, 2*clients)
		admin := testMySQLPool(t, 2)
		lockers := make([]Locker, clients)
		for i := range lockers {
			lockers[i] = NewMySQL(db)
		}
		ctx := context.Background()
		// A failed call closes its connection: the server frees its lock.
		run(t, lockers, 3*time.Second, time.Second, func(h *history) {
			third(h)
			for killed := 0; killed < 3; {
				h.mu.Lock()
				var key string
				if n := len(h.ops); n > 0 {
					key = h.ops[n-1].Input.(mutexOp).key
				}
				h.mu.Unlock()
				if key == "" || h.done.Load() >= clients*ops {
					return
				}
				call := h.now()
				var id sql.NullInt64
				if err := admin.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?)", mysqlName(key)).Scan(&id); err != nil {
					t.Error(err)
					return
				}
				if !id.Valid {
					continue
				}
				if _, err := admin.ExecContext(ctx, "KILL ?", id.Int64); err != nil {
					continue // the session ended meanwhile
				}
				// KILL returns before the session has gone and freed its lock.
				for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
					var used sql.NullInt64
					if err := admin.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?)", mysqlName(key)).Scan(&used); err != nil || !used.Valid || used.Int64 != id.Int64 {
						break
					}
				}
				h.Record([]string{key}, opFailover, call, h.now())
				killed++
				t.Logf("killed the session of %s's holder at %v", key, time.Duration(call).Round(time.Millisecond))
				time.Sleep(50 * time.Millisecond)
			}
		})
	})

	t.Run("redis", func(t *testing.T) {
		// The master is killed and Sentinel promotes its replica. A lock
		// the replica had not received is lost, and a release it had not
		// received brings the lock back until its ttl runs out: Redis's
		// own promise, which the model allows during the failover.
		s := testenv.StartSentinel(t)
		const ttl = 3 * time.Second
		lockers := make([]Locker, clients)
		for i := range lockers {
			rdb := redis.NewFailoverClient(&redis.FailoverOptions{
				MasterName: s.Name, SentinelAddrs: s.Addrs(),
				MaxRetries: -1, DialTimeout: 2 * time.Second,
			})
			t.Cleanup(func() { rdb.Close() })
			lockers[i] = NewRedis(rdb)
		}
		run(t, lockers, ttl, ttl+time.Second, func(h *history) {
			third(h)
			old := s.Master(t)
			call := h.now()
			old.Kill()
			s.WaitFailover(t, old, 30*time.Second)
			ret := h.now()
			t.Logf("the master failed over in %v", time.Duration(ret-call).Round(time.Millisecond))
			h.mu.Lock()
			keys := map[string]bool{}
			for _, op := range h.ops {
				keys[op.Input.(mutexOp).key] = true
			}
			h.mu.Unlock()
			for k := range keys {
				h.Record([]string{k}, opFailoverAsync, call, ret)
				h.Record([]string{k}, opExpire, call, ret+int64(ttl+time.Second))
			}
		})
	})

	t.Run("redlock", func(t *testing.T) {
		// Two of the five servers are killed, and restarted empty once
		// every lock they held has run out: a majority never forgets.
		// The clients pace their calls, so that the history goes on
		// after the restart.
		const ttl = time.Second
		servers := make([]*testenv.RedisServer, 5)
		for i := range servers {
			servers[i] = testenv.StartRedis(t)
		}
		lockers := make([]Locker, clients)
		for i := range lockers {
			rdbs := make([]redis.UniversalClient, len(servers))
			for j, s := range servers {
				rdb := redis.NewClient(&redis.Options{
					Addr: s.Addr(), MaxRetries: -1, DialerRetries: 1, DialTimeout: 2 * time.Second,
					ContextTimeoutEnabled: true,
				})
				t.Cleanup(func() { rdb.Close() })
				rdbs[j] = rdb
			}
			lockers[i] = NewRedLock(rdbs)
		}
		checkLinearizable(t, historyRun{
			lockers: lockers, keys: []string{testKey(t), testKey(t)},
			ops: ops, ttl: ttl, ghost: ttl + time.Second, splitVotes: true, pace: 100 * time.Millisecond,
			fault: func(h *history) {
				third(h)
				t.Logf("killing two of the five servers at %v", time.Duration(h.now()).Round(time.Millisecond))
				servers[0].Kill()
				servers[1].Kill()
				time.Sleep(ttl + ttl/2)
				servers[0].Restart(t)
				servers[1].Restart(t)
				t.Logf("restarted them, empty, at %v", time.Duration(h.now()).Round(time.Millisecond))
			},
		})
	})
}
