package lock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

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
