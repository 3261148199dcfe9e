package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// lockAcrossFailover: one master, one replica. A locks on the master with
// SET NX PX; the master dies before the write reaches the replica; the
// replica is promoted (the lab does what Sentinel would); B locks on the
// new master and gets it while A holds it.
func lockAcrossFailover(ctx context.Context) (outcome, error) {
	// The first sync starts at once, not after the default 5 s wait for
	// more replicas to join it.
	master, err := startRedis(ctx, "--repl-diskless-sync-delay", "0")
	if err != nil {
		return outcome{}, err
	}
	defer master.close()
	replica, err := startRedis(ctx, "--replicaof", "127.0.0.1", strconv.Itoa(master.port))
	if err != nil {
		return outcome{}, err
	}
	defer replica.close()
	if err := waitLinkUp(ctx, replica); err != nil {
		return outcome{}, err
	}

	// The lab: the replication link goes quiet just before A's write (the
	// replica now follows a port where nobody listens).
	tl := newTimeline(storyClock, since(time.Now()))
	if err := replica.rdb.Do(ctx, "REPLICAOF", "127.0.0.1", "1").Err(); err != nil {
		return outcome{}, err
	}
	tl.mark("replication link goes quiet")
	aGot, err := master.rdb.SetNX(ctx, failoverKey, "A", lockTTL).Result() // SET key A NX PX ttl
	if err != nil || !aGot {
		return outcome{}, fmt.Errorf("client A: %v, %v", aGot, err)
	}
	tl.take("A")
	master.kill()                                                               // dies before the write reached the replica
	if err := replica.rdb.Do(ctx, "REPLICAOF", "NO", "ONE").Err(); err != nil { // promoted
		return outcome{}, err
	}
	tl.mark("master killed, replica promoted")
	bGot, err := replica.rdb.SetNX(ctx, failoverKey, "B", lockTTL).Result()
	if err != nil {
		return outcome{}, fmt.Errorf("client B: %w", err)
	}
	return overlapOutcome(tl, bGot,
		"the promoted replica never had A's lock; B got it while A held it",
		"B refused"), nil
}

// waitLinkUp waits until the replica is in sync with its master.
func waitLinkUp(ctx context.Context, replica *redisProc) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := replica.rdb.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("replica on %s not in sync after 10s: %v", replica.addr(), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
