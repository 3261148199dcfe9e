package main

import (
	"context"

	"gorm.io/gorm"
)

// memoryQueue is a channel in the process: fast, and gone with it.
type memoryQueue struct{ orders chan int64 }

func newMemoryQueue() (orderQueue, func(), error) {
	return memoryQueue{orders: make(chan int64, acceptedOrders)}, func() {}, nil
}

func (q memoryQueue) accept(_ context.Context, user int64) error {
	q.orders <- user
	return nil
}

func (q memoryQueue) work(ctx context.Context, db *gorm.DB, limit int) error {
	for range limit {
		select {
		case user := <-q.orders:
			if err := writeOrder(ctx, db, user); err != nil {
				return err
			}
		default:
			return nil // empty
		}
	}
	return nil
}

// restart is a new process: its channel is new, and empty. What the old
// one held is gone.
func (memoryQueue) restart() orderQueue {
	return memoryQueue{orders: make(chan int64, acceptedOrders)}
}
