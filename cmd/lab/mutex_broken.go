package main

import (
	"context"
	"sync"

	"gorm.io/gorm"
)

// mutexInstance serves orders one at a time, under a mutex of its own.
//
// Within this instance, the user's requests take turns. The other
// instance has another mutex, and knows nothing of this one.
type mutexInstance struct {
	mu sync.Mutex
	db *gorm.DB
}

func (in *mutexInstance) order(ctx context.Context, user int64, pause func()) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	return orderQueried(ctx, in.db, user, pause) // the count, now "protected"
}

func (in *mutexInstance) close() {}
