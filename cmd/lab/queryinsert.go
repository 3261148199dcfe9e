package main

import (
	"context"
	"errors"
	"fmt"

	"gorm.io/gorm"

	"seckill/internal/lock"
)

// Experiment 3: one order per user by "query, then insert".
//
// A seckill sells one unit per user, against scalpers. The obvious code
// counts the user's orders and inserts one if there are none. A script,
// or an impatient double click, sends the same user's requests at once:
// each counts zero, each inserts. It is experiment 1 again, but on a row
// that does not exist yet, so no UPDATE ... WHERE can guard it. The fix
// has two parts: a lock per user, so the user's requests queue up instead
// of racing to the database, and a unique index on (user_id, voucher_id),
// the guard that holds even when a lock fails (experiments 7 to 11).
var queryInsert = experiment{
	name:   "query-insert",
	title:  "one order per user by query, then insert",
	counts: "duplicate order",
	lesson: "a count cannot guard a row that does not exist yet: a lock per user, and a unique index as the last guard",
	broken: func(ctx context.Context) (outcome, error) {
		return onePerUser(ctx, nil, orderQueried)
	},
	fixed: func(ctx context.Context) (outcome, error) {
		_, rdb, closeRedis, err := openRedis()
		if err != nil {
			return outcome{}, err
		}
		defer closeRedis()
		locks := lock.NewRedis(rdb)
		return onePerUser(ctx, []string{oneOrderPerUser},
			func(ctx context.Context, db *gorm.DB, user int64, pause func()) error {
				return orderLocked(ctx, locks, db, user, pause)
			})
	},
}

// The same user sends this many requests at once.
const (
	scalper      = 42
	userRequests = 5
)

// Refusals that are not failures: the user has an order, or another of
// the user's requests is being served.
var (
	errAlreadyOrdered = errors.New("already ordered")
	errBusy           = errors.New("busy")
)

// onePerUser runs userRequests orders of one user at once, on a database
// created with extra statements, and counts the orders beyond the first.
func onePerUser(ctx context.Context, extra []string, order buyFunc) (outcome, error) {
	db, closeDB, err := openDB(ctx, saleStock, extra...)
	if err != nil {
		return outcome{}, err
	}
	defer closeDB()

	errs := make([]error, userRequests)
	race(userRequests, func(i int, pause func()) {
		errs[i] = order(ctx, db, scalper, pause)
	})
	refused := 0
	for _, err := range errs {
		switch {
		case errors.Is(err, errAlreadyOrdered), errors.Is(err, errBusy):
			refused++
		case err != nil:
			return outcome{}, err
		}
	}
	orders, err := countOrders(ctx, db, scalper)
	if err != nil {
		return outcome{}, err
	}
	return outcome{
		violations: max(0, orders-1),
		summary:    fmt.Sprintf("%d requests, %s", userRequests, plural(orders, "order")),
		measures:   map[string]int{"orders": orders, "refused": refused},
	}, nil
}
