package main

import (
	"context"
	"fmt"

	"gorm.io/gorm"
)

// Experiment 13: orders accepted into a queue in the process's memory,
// and the process killed.
//
// The articles' asynchronous seckill answers the buyer as soon as the
// order is decided and leaves the database write to a background worker,
// fed through a queue. Their first version is a queue in the JVM's memory
// (a BlockingQueue; in Go, a channel). Everything in it dies with the
// process: a deploy, a crash, an OOM kill, and the buyers who were told
// "yes" have no order. The fix puts the queue outside the process, in a
// Redis Stream read by a consumer group: an entry stays pending until a
// consumer acknowledges it, and another consumer claims what a dead one
// held. (The service's async mode does exactly this, in internal/order.)
var inProcessQueue = experiment{
	name:   "in-process-queue",
	title:  "orders queued in process memory, process killed",
	counts: "lost order",
	lesson: "a promise the process keeps only in memory dies with it: queue in Redis Streams, acknowledge after the write, claim a dead consumer's entries",
	broken: func(ctx context.Context) (outcome, error) { return killedWorker(ctx, newMemoryQueue) },
	fixed:  func(ctx context.Context) (outcome, error) { return killedWorker(ctx, newStreamQueue) },
}

const (
	acceptedOrders    = 20 // buyers told "yes" before the writer runs
	writtenBeforeKill = 5  // orders the first worker writes before it is killed
)

// orderQueue is where accepted orders wait for the database.
type orderQueue interface {
	// accept queues the order of user: once it returns, the buyer has
	// been told "yes".
	accept(ctx context.Context, user int64) error
	// work writes queued orders to db and returns after limit of them
	// (the lab kills it there), or when the queue is empty.
	work(ctx context.Context, db *gorm.DB, limit int) error
	// restart is what comes back after the kill: a new process with an
	// empty memory, or another consumer of the same stream.
	restart() orderQueue
}

// killedWorker accepts acceptedOrders, lets a worker write a few and die,
// then lets what comes back after it work until the queue is empty. Every
// accepted order without a row at the end is a violation.
func killedWorker(ctx context.Context, newQueue func() (orderQueue, func(), error)) (outcome, error) {
	db, closeDB, err := openDB(ctx, acceptedOrders)
	if err != nil {
		return outcome{}, err
	}
	defer closeDB()
	q, done, err := newQueue()
	if err != nil {
		return outcome{}, err
	}
	defer done()
	for user := int64(1); user <= acceptedOrders; user++ {
		if err := q.accept(ctx, user); err != nil {
			return outcome{}, err
		}
	}
	if err := q.work(ctx, db, writtenBeforeKill); err != nil {
		return outcome{}, err
	}
	// Killed. What comes back works until nothing is left.
	if err := q.restart().work(ctx, db, acceptedOrders); err != nil {
		return outcome{}, err
	}
	var rows int64
	if err := db.WithContext(ctx).Raw("SELECT COUNT(*) FROM orders").Scan(&rows).Error; err != nil {
		return outcome{}, err
	}
	lost := acceptedOrders - int(rows)
	return outcome{
		violations: max(lost, 0),
		summary:    fmt.Sprintf("%d accepted, %d written", acceptedOrders, rows),
		measures:   map[string]int{"accepted": acceptedOrders, "written": int(rows)},
	}, nil
}

// writeOrder is the database write both queues end in.
func writeOrder(ctx context.Context, db *gorm.DB, user int64) error {
	return db.WithContext(ctx).Exec("INSERT INTO orders (user_id, voucher_id) VALUES (?, ?)", user, voucherID).Error
}
