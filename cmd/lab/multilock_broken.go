package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/lock"
)

// multiLock is the course's MultiLock (Redisson's RedissonMultiLock): the
// same lock taken on each of several independent Redis nodes, each with
// package lock's one-node lock, in order. It is held only when every node
// granted it; when one refuses, or cannot be asked, the nodes already
// taken are released, and the whole is refused.
//
// Not to be confused with package lock's ObtainAll, which takes several
// keys (several resources) from one backend, all or none: the course's
// MultiLock is one key on several servers, for safety, not for several
// resources.
type multiLock struct{ nodes []*lock.Redis }

func newMultiLock(clients []*redis.Client) nodeLocker {
	var m multiLock
	for _, c := range clients {
		m.nodes = append(m.nodes, lock.NewRedis(c))
	}
	return m
}

// errNodeDown is a node multiLock could not ask.
type errNodeDown struct {
	node int
	err  error
}

func (e errNodeDown) Error() string { return fmt.Sprintf("node %d: %v", e.node, e.err) }
func (e errNodeDown) Unwrap() error { return e.err }

func (m multiLock) obtain(ctx context.Context, key string, ttl time.Duration) (func(context.Context) error, error) {
	var held []lock.Lock
	release := func(ctx context.Context) error {
		var errs []error
		for _, lk := range held {
			errs = append(errs, lk.Release(ctx))
		}
		return errors.Join(errs...)
	}
	for i, n := range m.nodes {
		lk, err := n.Obtain(ctx, key, ttl)
		if err != nil {
			_ = release(context.WithoutCancel(ctx))
			if errors.Is(err, lock.ErrNotAcquired) {
				return nil, err
			}
			return nil, errNodeDown{node: i + 1, err: err} // every node is needed: one down, the lock is
		}
		held = append(held, lk)
	}
	return release, nil
}
