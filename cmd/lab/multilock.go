package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"seckill/internal/lock"
)

// Experiment 19: one lock on every one of several Redis nodes, one node
// down.
//
// The course's answer to experiment 12 (a lock lost in a failover) is
// Redisson's MultiLock: the same lock on each of several independent Redis
// nodes, held only when every node granted it. A node that loses the lock
// cannot hand it to anyone else, since the others still refuse: as long as
// one node kept it, the lock is safe. But every node is needed to take it,
// so one node down stops the lock, and with it whatever work waits for
// it, though nobody holds it: the lock is less available than a single
// Redis. RedLock (package lock's RedLock, over go-redsync) asks for a
// majority instead: one node of three down, the lock is still taken, and
// still refused to a second client. What RedLock pays for that is
// experiment 12b: with a bare majority, a node that restarts empty can
// hand the lock out twice, where MultiLock would not.
var multilockNodes = experiment{
	name:   "multilock-nodes",
	title:  "a lock on every one of three nodes, one node down",
	counts: "needless refusal",
	lesson: "a lock that needs every node is down when any node is; RedLock needs a majority",
	broken: func(ctx context.Context) (outcome, error) { return nodeDown(ctx, newMultiLock) },
	fixed:  func(ctx context.Context) (outcome, error) { return nodeDown(ctx, newNodesRedLock) },
}

// lockNodes is how many independent Redis nodes the lock spans.
const lockNodes = 3

// nodeLocker takes one lock over several nodes, trying once, and returns
// what gives it back; or lock.ErrNotAcquired, or the error of a node it
// could not ask (errNodeDown), when it did not get it.
type nodeLocker interface {
	obtain(ctx context.Context, key string, ttl time.Duration) (release func(context.Context) error, err error)
}

// nodeDown starts lockNodes nodes, stops the last, and lets A then B ask
// for the lock. Each refusal while nobody held the lock is a violation
// (the lock is out of service), and so is B getting a lock A holds.
func nodeDown(ctx context.Context, newLocker func([]*redis.Client) nodeLocker) (outcome, error) {
	var (
		srvs    []*miniredis.Miniredis
		clients []*redis.Client
	)
	defer func() {
		for i := range srvs {
			_ = clients[i].Close()
			srvs[i].Close()
		}
	}()
	for range lockNodes {
		srv, err := miniredis.Run()
		if err != nil {
			return outcome{}, fmt.Errorf("start miniredis: %w", err)
		}
		srvs = append(srvs, srv)
		// One dial, no retries: a node that is down says so at once, and a
		// retry could run a lock command twice (see servers.go).
		clients = append(clients, redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, DialerRetries: 1,
			DialTimeout: 500 * time.Millisecond, ContextTimeoutEnabled: true}))
	}
	locker := newLocker(clients)
	srvs[lockNodes-1].Close() // the lab: node 3 goes down

	releaseA, err := locker.obtain(ctx, failoverKey, lockTTL)
	aGot := err == nil
	if err != nil && !refusal(err) {
		return outcome{}, fmt.Errorf("client A: %w", err)
	}
	needless := 0
	if aGot {
		defer releaseA(context.WithoutCancel(ctx))
	} else {
		needless++
	}
	releaseB, err := locker.obtain(ctx, failoverKey, lockTTL)
	bGot := err == nil
	if err != nil && !refusal(err) {
		return outcome{}, fmt.Errorf("client B: %w", err)
	}
	overlaps := 0
	switch {
	case bGot && aGot:
		overlaps++ // two holders: the lock failed at its one job
	case !bGot && !aGot:
		needless++
	}
	if bGot {
		defer releaseB(context.WithoutCancel(ctx))
	}

	var summary string
	switch {
	case !aGot && !bGot:
		summary = fmt.Sprintf("node %d down: A and B refused; nobody held the lock", lockNodes)
	case aGot && !bGot:
		summary = fmt.Sprintf("node %d down: A got %d of %d nodes; B refused while A held it", lockNodes, lockNodes-1, lockNodes)
	case aGot && bGot:
		summary = "B got the lock while A held it"
	default:
		summary = "A refused, B got the lock"
	}
	return outcome{
		violations: needless + overlaps,
		summary:    summary,
		measures:   map[string]int{"nodes": lockNodes, "nodes_down": 1, "refused_free": needless, "overlapping_holders": overlaps},
	}, nil
}

// refusal reports whether err is a refusal of the lock: taken, or a node
// that could not be asked. The lab tells them apart by who held the lock.
func refusal(err error) bool {
	var nodeErr errNodeDown
	return errors.Is(err, lock.ErrNotAcquired) || errors.As(err, &nodeErr)
}

// newNodesRedLock is package lock's RedLock over the nodes: a lock is held
// when a majority, 2 of 3, granted it.
func newNodesRedLock(clients []*redis.Client) nodeLocker {
	var cs []redis.UniversalClient
	for _, c := range clients {
		cs = append(cs, c)
	}
	return redLockNodes{lock.NewRedLock(cs)}
}

type redLockNodes struct{ rl *lock.RedLock }

func (r redLockNodes) obtain(ctx context.Context, key string, ttl time.Duration) (func(context.Context) error, error) {
	lk, err := r.rl.Obtain(ctx, key, ttl)
	if err != nil {
		return nil, err
	}
	return lk.Release, nil
}
