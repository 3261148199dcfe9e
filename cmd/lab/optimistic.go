package main

import (
	"context"
	"fmt"
)

// Experiment 2: optimistic locking by version.
//
// The usual answer to experiment 1 is optimistic locking: read the stock
// with its version, and write only if the version is still the one read.
// It does stop the oversell. But in a seckill everybody reads the same
// version at the same moment, one write wins, and every other buyer is
// refused although units are left: 10 units, 30 buyers, 1 sale. The same
// happens with "WHERE stock = <the value read>" in place of a version.
// The stock does not need to be unchanged, only positive; the fix is
// experiment 1's guarded UPDATE.
var optimistic = experiment{
	name:   "optimistic",
	title:  "optimistic lock by version",
	counts: "unsold unit",
	lesson: "a sale needs stock > 0, not an unchanged row: a version check refuses buyers while units are left",
	broken: func(ctx context.Context) (outcome, error) { return optimisticRun(ctx, buyVersioned) },
	fixed:  func(ctx context.Context) (outcome, error) { return optimisticRun(ctx, buyGuarded) },
}

// optimisticRun counts the units left unsold to buyers who were refused:
// each is a sale lost for no reason.
func optimisticRun(ctx context.Context, buy buyFunc) (outcome, error) {
	res, err := sale(ctx, buy)
	if err != nil {
		return outcome{}, err
	}
	return outcome{
		violations: min(res.stock, res.refused),
		summary:    fmt.Sprintf("%d%% of %d buyers served, stock %d", 100*res.orders/saleBuyers, saleBuyers, res.stock),
		measures:   map[string]int{"orders": res.orders, "stock": res.stock, "refused": res.refused},
	}, nil
}
