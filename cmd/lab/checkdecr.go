package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/stock"
)

// Experiment 17: check the stock in Redis, then DECR it.
//
// The course moves the stock to Redis to spare MySQL, and a student's
// first version does there what experiment 1 did in SQL: GET the stock,
// and if some is left, DECR it. Each command is atomic; the pair is not.
// Every buyer who reads before any decrements sees a unit left, and
// DECR, which has no condition, takes the stock below zero. That is the
// course's reason for Lua: a script runs in Redis with nothing in between,
// so the check and the take are one step. The fix is the project's own:
// package stock's take.lua, which checks the stock (and the buyer, and
// records a hold) and takes the unit in one script.
var checkDecr = experiment{
	name:   "redis-check-decr",
	title:  "GET the stock in Redis, then DECR it",
	counts: "oversold unit",
	lesson: "check and take in one Lua script (package stock's Take), not GET then DECR",
	broken: func(ctx context.Context) (outcome, error) { return redisSale(ctx, takeGetDecr) },
	fixed:  func(ctx context.Context) (outcome, error) { return redisSale(ctx, takeScripted) },
}

// takeFunc takes one unit of the voucher's stock in Redis for user, or
// returns errSoldOut. pause is the lab's hook, as in buyFunc.
type takeFunc func(ctx context.Context, st *redisStock, user int64, pause func()) error

// redisStock is a voucher's stock in the lab's Redis, set up as the
// service sets it up (package stock's keys, filled by Init).
type redisStock struct {
	rdb   *redis.Client
	store *stock.Store
	keys  stock.Keys
}

// redisSale puts saleStock units in Redis and lets saleBuyers different
// users take one at once, each once, as experiment 1 does in MySQL.
func redisSale(ctx context.Context, take takeFunc) (outcome, error) {
	_, rdb, closeRedis, err := openRedis()
	if err != nil {
		return outcome{}, err
	}
	defer closeRedis()
	st := &redisStock{rdb: rdb, store: stock.NewStore(rdb, time.Minute), keys: stock.KeysOf(voucherID)}
	if err := st.store.Init(ctx, voucherID, saleStock, 1); err != nil {
		return outcome{}, err
	}

	errs := make([]error, saleBuyers)
	race(saleBuyers, func(i int, pause func()) {
		errs[i] = take(ctx, st, int64(i+1), pause)
	})
	sold, refused := 0, 0
	for _, err := range errs {
		switch {
		case errors.Is(err, errSoldOut):
			refused++
		case err != nil:
			return outcome{}, err
		default:
			sold++
		}
	}
	left, err := rdb.Get(ctx, st.keys.Stock).Int()
	if err != nil {
		return outcome{}, err
	}
	return outcome{
		violations: max(0, sold-saleStock),
		summary:    fmt.Sprintf("%d units taken of %d, stock in Redis %d", sold, saleStock, left),
		measures:   map[string]int{"taken": sold, "stock": left, "refused": refused},
	}, nil
}

// takeScripted is the service's take: take.lua checks the stock, checks
// that the user has not bought, decrements and records a hold, in one
// script that Redis runs with nothing in between.
func takeScripted(ctx context.Context, st *redisStock, user int64, pause func()) error {
	pause() // the lab: the same crowd arrives at once; nothing to split

	_, res, err := st.store.Take(ctx, voucherID, 1, user)
	switch {
	case err != nil:
		return err
	case res == stock.SoldOut, res == stock.SoldOutForNow:
		return errSoldOut
	case res != stock.Taken:
		return fmt.Errorf("take for user %d: result %d", user, res)
	}
	return nil
}
