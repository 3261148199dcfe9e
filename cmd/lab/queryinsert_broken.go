package main

import (
	"context"

	"gorm.io/gorm"
)

// orderQueried writes the user's order unless the user has one already.
//
// The count sees only orders already written. Every request of the user
// that counts before the first insert sees none.
func orderQueried(ctx context.Context, db *gorm.DB, user int64, pause func()) error {
	n, err := countOrders(ctx, db, user)
	if err != nil {
		return err
	}
	if n > 0 {
		return errAlreadyOrdered
	}

	pause() // the lab: all the user's requests have counted

	return buyGuarded(ctx, db, user, func() {})
}
