package order

import (
	"context"
	"errors"
	"fmt"
	"seckill/internal/stock"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// The orders stream of async mode: accept.lua (async.go) adds an entry per
// accepted order; package order/queue consumes them. This file is their
// shared vocabulary: the keys, an entry's fields, and the admin's view.

// Redis keys of async mode.
const (
	StreamKey  = "seckill:orders"         // accepted orders, oldest first
	DeadKey    = "seckill:orders:dead"    // entries that could not be written
	PendingKey = "seckill:orders:pending" // order ID -> user:voucher:ms:status
	GroupName  = "persist"                // the one consumer group
)

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

// Stats reads the queue's state.
func (s *Service) QueueStats(ctx context.Context) (QueueStats, error) {
	var st QueueStats
	pipe := s.rdb.Pipeline()
	length := pipe.XLen(ctx, StreamKey)
	dead := pipe.XLen(ctx, DeadKey)
	recent := pipe.XRevRangeN(ctx, DeadKey, "+", "-", 20)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return st, fmt.Errorf("queue stats: %w", err)
	}
	st.Length, st.DeadLetters = length.Val(), dead.Val()
	st.Consumers = []string{}
	st.RecentDead = []DeadLetters{}
	for _, m := range recent.Val() {
		st.RecentDead = append(st.RecentDead, DeadLetters{ID: m.ID, Values: m.Values})
	}
	groups, err := s.rdb.XInfoGroups(ctx, StreamKey).Result()
	if err != nil && !strings.Contains(err.Error(), "no such key") {
		return st, fmt.Errorf("queue stats: %w", err)
	}
	for _, g := range groups {
		if g.Name == GroupName {
			st.Lag, st.Pending = g.Lag, g.Pending
		}
	}
	if consumers, err := s.rdb.XInfoConsumers(ctx, StreamKey, GroupName).Result(); err == nil {
		for _, c := range consumers {
			st.Consumers = append(st.Consumers, c.Name)
		}
	}
	return st, nil
}
