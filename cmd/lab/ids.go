package main

import (
	"context"
	"fmt"

	"gorm.io/gorm"
)

// Experiment 14: order IDs from each database's auto-increment.
//
// The first order table numbers its rows with AUTO_INCREMENT: 1, 2, 3...
// That works while there is one database. A sale big enough to split its
// orders over two databases (shards) gets two counters, each starting at
// 1: the same ID names two orders, and any place that brings them
// together (a report, a refund, a customer's order list) mixes them up.
// And an ID that counts the orders tells a competitor how many were sold
// between two of theirs. The fix draws IDs from one sequence all shards
// share: seconds since an epoch in the high bits, a per-day Redis INCR in
// the low ones (internal/idworker).
var orderIDs = experiment{
	name:   "order-ids",
	title:  "order IDs from each shard's auto-increment",
	counts: "ID collision",
	lesson: "IDs must come from one source all shards share: a Redis INCR under a timestamp, not each table's counter",
	broken: func(ctx context.Context) (outcome, error) { return shardedSale(ctx, orderAutoIncrement) },
	fixed:  func(ctx context.Context) (outcome, error) { return shardedSale(ctx, newSharedIDs) },
}

// Two shards, and buyers spread over them by user ID.
const (
	shards       = 2
	shardedUsers = 20
)

// orderWriter writes one order in a shard and returns its ID. newWriter
// makes one for a sale, with whatever it shares across shards.
type orderWriter func(ctx context.Context, shard *gorm.DB, user int64) (int64, error)

// shardedSale writes one order per user into the user's shard and counts
// the IDs that name more than one order.
func shardedSale(ctx context.Context, newWriter func() (orderWriter, func(), error)) (outcome, error) {
	write, done, err := newWriter()
	if err != nil {
		return outcome{}, err
	}
	defer done()
	dbs := make([]*gorm.DB, shards)
	for i := range dbs {
		db, closeDB, err := openDB(ctx, shardedUsers)
		if err != nil {
			return outcome{}, err
		}
		defer closeDB()
		dbs[i] = db
	}
	seen := map[int64]int{}
	collisions := 0
	for user := int64(1); user <= shardedUsers; user++ {
		id, err := write(ctx, dbs[user%shards], user)
		if err != nil {
			return outcome{}, err
		}
		if seen[id]++; seen[id] > 1 {
			collisions++
		}
	}
	summary := fmt.Sprintf("%d orders, %d distinct IDs over %d shards", shardedUsers, len(seen), shards)
	return outcome{
		violations: collisions,
		summary:    summary,
		measures:   map[string]int{"orders": shardedUsers, "distinct_ids": len(seen), "shards": shards},
	}, nil
}
