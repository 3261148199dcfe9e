package queue

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"

	"seckill/internal/stock"
)

// Stats is what admins see of the queue (GET /admin/queue, and the
// metrics seckill_queue_*): every shard's, added up.
type Stats struct {
	Length      int64        `json:"length"`  // entries in the streams (written ones until trimmed)
	Lag         int64        `json:"lag"`     // entries not yet delivered to any consumer
	Pending     int64        `json:"pending"` // delivered, not yet acknowledged
	Consumers   []string     `json:"consumers"`
	DeadLetters int64        `json:"dead_letters"`
	RecentDead  []DeadLetter `json:"recent_dead_letters"` // the newest 20, newest first
}

// recentDead is how many of the newest dead letters Stats shows.
const recentDead = 20

// Stats reads the queue's state.
func (q *Queue) Stats(ctx context.Context) (Stats, error) {
	st := Stats{Consumers: []string{}, RecentDead: []DeadLetter{}}
	consumers := map[string]bool{}
	var recent []deadLetter
	for k := range stock.Shards {
		pipe := q.rdb.Pipeline()
		length := pipe.XLen(ctx, StreamKey(k))
		dead := pipe.XLen(ctx, deadKey(k))
		newest := pipe.XRevRangeN(ctx, deadKey(k), "+", "-", recentDead)
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return st, fmt.Errorf("queue stats: %w", err)
		}
		st.Length += length.Val()
		st.DeadLetters += dead.Val()
		for _, m := range newest.Val() {
			recent = append(recent, deadLetter{k, m})
		}
		groups, err := q.rdb.XInfoGroups(ctx, StreamKey(k)).Result()
		if err != nil && !strings.Contains(err.Error(), "no such key") {
			return st, fmt.Errorf("queue stats: %w", err)
		}
		for _, g := range groups {
			if g.Name == GroupName {
				st.Lag += g.Lag
				st.Pending += g.Pending
			}
		}
		if cs, err := q.rdb.XInfoConsumers(ctx, StreamKey(k), GroupName).Result(); err == nil {
			for _, c := range cs {
				if !consumers[c.Name] {
					consumers[c.Name] = true
					st.Consumers = append(st.Consumers, c.Name)
				}
			}
		}
	}
	// The newest of all shards, newest first.
	slices.SortFunc(recent, func(a, b deadLetter) int { return b.compare(a) })
	for _, d := range recent[:min(len(recent), recentDead)] {
		st.RecentDead = append(st.RecentDead, d.public())
	}
	return st, nil
}
