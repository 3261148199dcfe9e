package main

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// newClusterClient returns the client of a Redis Cluster, made to keep the
// promises the single-node client keeps with MaxRetries: -1.
//
// go-redis' cluster client follows MOVED and ASK (a slot moved: the
// command did not run, sending it to the right node is safe) but it also
// sends a command again, to the same node and then another, when its
// connection failed or timed out, whatever MaxRetries says. For the stock
// scripts that is wrong: the reply may be what was lost, and a second run
// answers "already bought" to the buyer whose unit the first run took, or
// takes a unit the first one took. sentOnce turns those failures into
// errors the client does not retry: the caller decides, as it does on one
// node (take: the sweeper; accept: ask whether it was accepted). That holds
// for single commands, which every script is. A pipeline's commands are
// re-sent inside go-redis before any hook sees the error; the pipelined
// commands may run twice, but for stock.Init (docs/redis-ha.md, "Redis Cluster").
//
// The cluster client also learns of a failover only when a node says
// MOVED, or when its slot map is older than ClusterStateReloadInterval (a
// minute by default): meanwhile every command for the dead master's slots
// fails to dial. So the map is reloaded every few seconds, and at once
// when a node cannot be reached.
func newClusterClient(opt *redis.UniversalOptions) *redis.ClusterClient {
	c := opt.Cluster()
	c.ClusterStateReloadInterval = 2 * time.Second
	rdb := redis.NewClusterClient(c)
	rdb.OnNewNode(func(node *redis.Client) { node.AddHook(sentOnce{rdb}) })
	return rdb
}

// sentOnce is the hook on every node's client (see newClusterClient).
type sentOnce struct{ cluster *redis.ClusterClient }

func (sentOnce) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h sentOnce) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := h.final(ctx, next(ctx, cmd))
		if err != nil {
			cmd.SetErr(err)
		}
		return err
	}
}

func (h sentOnce) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := h.final(ctx, next(ctx, cmds))
		for _, cmd := range cmds {
			if e := cmd.Err(); e != nil {
				cmd.SetErr(h.final(ctx, e))
			}
		}
		return err
	}
}

// final leaves Redis' own answers alone (MOVED, ASK and the rest, which
// the cluster client must see, and redis.Nil) and wraps a failure of the
// connection in an error the cluster client does not retry.
func (h sentOnce) final(ctx context.Context, err error) error {
	var answer redis.Error
	var lost *connectionLost
	if err == nil || errors.As(err, &answer) || errors.As(err, &lost) || ctx.Err() != nil {
		return err
	}
	h.cluster.ReloadState(ctx)
	return &connectionLost{err}
}

// connectionLost is a failure of the connection to a node. It does not
// unwrap: go-redis decides to retry by what the error wraps (io.EOF, a
// net.Error), and must not see it.
type connectionLost struct{ err error }

func (e *connectionLost) Error() string { return "redis cluster node: " + e.err.Error() }
