package main

import (
	"context"
	"errors"
	"fmt"

	"gorm.io/gorm"
)

// Experiment 4: a sync.Mutex in each of two instances.
//
// Experiment 3's lock must exclude the user's requests wherever they are
// served. A sync.Mutex (Java's synchronized, in the articles) does that
// inside one process. Behind a load balancer the service runs twice, the
// user's two requests land on both instances, and each instance's mutex is
// free: both count zero, both insert. The lock has to live where every
// instance sees it, in Redis. Neither variant has the unique index here,
// so that the lock alone is measured.
var localMutex = experiment{
	name:   "local-mutex",
	title:  "sync.Mutex on two service instances",
	counts: "duplicate order",
	lesson: "a lock in memory excludes goroutines of one process; instances share only Redis",
	broken: func(ctx context.Context) (outcome, error) {
		return twoInstances(ctx, func(db *gorm.DB) instance { return &mutexInstance{db: db} })
	},
	fixed: func(ctx context.Context) (outcome, error) {
		srv, _, closeRedis, err := openRedis()
		if err != nil {
			return outcome{}, err
		}
		defer closeRedis()
		return twoInstances(ctx, func(db *gorm.DB) instance { return newRedisInstance(srv.Addr(), db) })
	},
}

// An instance is one process of the service, reduced to its order path.
type instance interface {
	order(ctx context.Context, user int64, pause func()) error
	close()
}

// twoInstances starts two instances on one database and sends one
// request of the same user to each, at once.
func twoInstances(ctx context.Context, start func(db *gorm.DB) instance) (outcome, error) {
	db, closeDB, err := openDB(ctx, saleStock)
	if err != nil {
		return outcome{}, err
	}
	defer closeDB()
	instances := []instance{start(db), start(db)}
	defer func() {
		for _, in := range instances {
			in.close()
		}
	}()

	errs := make([]error, len(instances))
	race(len(instances), func(i int, pause func()) {
		errs[i] = instances[i].order(ctx, scalper, pause)
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
		summary:    fmt.Sprintf("2 instances, %s", plural(orders, "order")),
		measures:   map[string]int{"orders": orders, "refused": refused},
	}, nil
}
