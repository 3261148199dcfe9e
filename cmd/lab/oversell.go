package main

import (
	"context"
	"errors"
	"fmt"

	"gorm.io/gorm"
)

// Experiment 1: check the stock, then decrement it.
//
// The first seckill anyone writes reads the stock, and if some is left,
// decrements it and writes the order. Under load, many buyers read the
// same last units before any of them has written: each sees stock left,
// each decrements, and the voucher sells more than it has. The lab makes
// every buyer read before any writes; the fix puts the check into the
// write itself, where the database evaluates it atomically for each row.
var oversell = experiment{
	name:   "oversell",
	title:  "check stock, then decrement",
	counts: "oversold unit",
	lesson: "check inside the write: UPDATE ... WHERE stock > 0, and trust RowsAffected",
	broken: func(ctx context.Context) (outcome, error) { return oversellRun(ctx, buyChecked) },
	fixed:  func(ctx context.Context) (outcome, error) { return oversellRun(ctx, buyGuarded) },
}

// A sale has more buyers than units, as every seckill does.
const (
	saleStock  = 10
	saleBuyers = 30
)

// errSoldOut is a buyer's polite refusal: no order, and no harm done.
var errSoldOut = errors.New("sold out")

// buyFunc sells one unit of the voucher to user, or returns errSoldOut.
// pause is the lab's hook: the variant calls it where a race would hurt.
type buyFunc func(ctx context.Context, db *gorm.DB, user int64, pause func()) error

// saleResult is what a sale left in the database.
type saleResult struct {
	orders, stock, refused int
}

// sale lets saleBuyers different users buy at once, each once.
func sale(ctx context.Context, buy buyFunc) (saleResult, error) {
	db, closeDB, err := openDB(ctx, saleStock)
	if err != nil {
		return saleResult{}, err
	}
	defer closeDB()

	errs := make([]error, saleBuyers)
	race(saleBuyers, func(i int, pause func()) {
		errs[i] = buy(ctx, db, int64(i+1), pause)
	})
	var res saleResult
	for _, err := range errs {
		switch {
		case errors.Is(err, errSoldOut):
			res.refused++
		case err != nil:
			return res, err
		}
	}
	if res.orders, err = countOrders(ctx, db, 0); err != nil {
		return res, err
	}
	if res.stock, err = stockLeft(ctx, db); err != nil {
		return res, err
	}
	return res, nil
}

// oversellRun counts the units sold beyond the stock.
func oversellRun(ctx context.Context, buy buyFunc) (outcome, error) {
	res, err := sale(ctx, buy)
	if err != nil {
		return outcome{}, err
	}
	return outcome{
		violations: max(0, res.orders-saleStock),
		summary:    fmt.Sprintf("%d orders, stock %d", res.orders, res.stock),
		measures:   map[string]int{"orders": res.orders, "stock": res.stock, "refused": res.refused},
	}, nil
}
