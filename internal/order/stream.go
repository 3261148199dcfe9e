package order

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/stock"
)

// The orders stream of async mode: accept.lua (async.go) adds an entry per
// accepted order; package order/queue consumes them. This file is their
// shared vocabulary: the keys, an entry's fields, and the admin's view.

// Redis keys of async mode, one set per shard (stock.Shards): a voucher's
// orders go to its shard's stream, in the same Redis Cluster slot as the
// voucher's own keys, so that accept.lua may touch them all.

// StreamKey names shard k's stream of accepted orders, oldest first.
func StreamKey(k int) string { return stock.ShardKey(k, "orders") }

// DeadKey names shard k's dead letters: entries that could not be written.
func DeadKey(k int) string { return stock.ShardKey(k, "orders:dead") }

// PendingKey names shard k's hash of orders not yet written: order ID ->
// user:voucher:ms:status.
func PendingKey(k int) string { return stock.ShardKey(k, "orders:pending") }

// GroupName is the consumer group of every stream.
const GroupName = "persist"

// AcceptedKey names the voucher's accepted orders: user -> order ID,
// written by accept.lua in the same step as the order, read when its
// answer was lost (lost.lua).
func AcceptedKey(voucherID int64) string { return stock.KeyOf(voucherID, "accepted") }

// QueuedKey names the voucher's count of accepted orders not yet written
// (accept.lua and replay.lua add, ack.lua and dead.lua take off).
func QueuedKey(voucherID int64) string { return stock.KeyOf(voucherID, "queued") }

// ParseEntry reads an order from a stream entry.
func ParseEntry(m redis.XMessage) (Order, error) {
	num := func(name string) (int64, error) {
		s, _ := m.Values[name].(string)
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 {
			return 0, fmt.Errorf("entry %s: field %s = %q is not a positive integer", m.ID, name, s)
		}
		return n, nil
	}
	id, err1 := num("id")
	user, err2 := num("user")
	voucherID, err3 := num("voucher")
	at, err4 := num("at")
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return Order{}, err
	}
	return Order{ID: id, UserID: user, VoucherID: voucherID, Status: StatusCreated, CreatedAt: time.UnixMilli(at).UTC()}, nil
}

// QueueStats is what admins see of the queue.
type QueueStats struct {
	Length      int64         `json:"length"`  // entries in the stream (written ones until trimmed)
	Lag         int64         `json:"lag"`     // entries not yet delivered to any consumer
	Pending     int64         `json:"pending"` // delivered, not yet acknowledged
	Consumers   []string      `json:"consumers"`
	DeadLetters int64         `json:"dead_letters"`
	RecentDead  []DeadLetters `json:"recent_dead_letters"`
}

// DeadLetters is one dead-letter entry.
type DeadLetters struct {
	ID     string         `json:"id"`
	Values map[string]any `json:"values"`
}

// QueueStats reads the queue's state: every shard's, added up.
func (s *Service) QueueStats(ctx context.Context) (QueueStats, error) {
	st := QueueStats{Consumers: []string{}, RecentDead: []DeadLetters{}}
	consumers := map[string]bool{}
	for k := range stock.Shards {
		pipe := s.rdb.Pipeline()
		length := pipe.XLen(ctx, StreamKey(k))
		dead := pipe.XLen(ctx, DeadKey(k))
		recent := pipe.XRevRangeN(ctx, DeadKey(k), "+", "-", 20)
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return st, fmt.Errorf("queue stats: %w", err)
		}
		st.Length += length.Val()
		st.DeadLetters += dead.Val()
		for _, m := range recent.Val() {
			st.RecentDead = append(st.RecentDead, DeadLetters{ID: deadLetterID(k, m.ID), Values: m.Values})
		}
		groups, err := s.rdb.XInfoGroups(ctx, StreamKey(k)).Result()
		if err != nil && !strings.Contains(err.Error(), "no such key") {
			return st, fmt.Errorf("queue stats: %w", err)
		}
		for _, g := range groups {
			if g.Name == GroupName {
				st.Lag += g.Lag
				st.Pending += g.Pending
			}
		}
		if cs, err := s.rdb.XInfoConsumers(ctx, StreamKey(k), GroupName).Result(); err == nil {
			for _, c := range cs {
				if !consumers[c.Name] {
					consumers[c.Name] = true
					st.Consumers = append(st.Consumers, c.Name)
				}
			}
		}
	}
	// The newest 20 of all shards, newest first.
	slices.SortFunc(st.RecentDead, func(a, b DeadLetters) int { return compareEntryIDs(b.ID, a.ID) })
	st.RecentDead = st.RecentDead[:min(len(st.RecentDead), 20)]
	return st, nil
}
