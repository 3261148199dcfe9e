package main

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/room"
	"seckill/internal/stock"
)

// Experiment 16: a waiting room that counts the stock in a second step.
//
// A waiting room admits the next buyer while a unit is free: neither sold
// nor held by a buyer admitted before. The obvious admitter reads how
// many units are free, then, if any, admits the next number. Every
// instance runs an admitter, and two that read at the same moment both
// see the last free unit and both admit: two buyers hold one unit, and
// the one who presses second is told sold_out while the room promised
// them a unit. The lab makes every admitter read before any admits. The
// fix is the project's admit.lua (package room): the count and the
// admission are one script, which Redis runs with nothing in between.
var roomTwoSteps = experiment{
	name:   "room-two-steps",
	title:  "a waiting room that counts the stock, then admits",
	counts: "extra hold",
	lesson: "admit in the step that counts the stock: one script, not a read then a write",
	broken: func(ctx context.Context) (outcome, error) { return roomRun(ctx, admitTwoSteps) },
	fixed:  func(ctx context.Context) (outcome, error) { return roomRun(ctx, admitOneScript) },
}

// A room with fewer units than admitters asking at once.
const (
	roomUnits     = 2
	roomAdmitters = 6
	roomBuyers    = 20
)

// admitFunc admits what it may of sale's room; pause is the lab's hook.
type admitFunc func(ctx context.Context, st *roomStack, pause func()) error

// roomStack is a room on the lab's Redis.
type roomStack struct {
	rdb   *redis.Client
	store *room.Store
	sale  room.Sale
	keys  stock.Keys
}

// roomRun fills a room, lets roomAdmitters admit at once, and counts the
// holds beyond the units.
func roomRun(ctx context.Context, admit admitFunc) (outcome, error) {
	_, rdb, closeRedis, err := openRedis()
	if err != nil {
		return outcome{}, err
	}
	defer closeRedis()
	now := time.Now()
	sale := room.Sale{
		VoucherID: voucherID, Begin: now.Add(300 * time.Millisecond), End: now.Add(time.Hour), Stock: roomUnits,
		Seed:   make([]byte, room.SeedSize),
		Config: room.Config{OpensAt: now.Add(-time.Minute), AdmitPerSecond: 1000, HoldFor: time.Minute},
	}
	if err := stock.NewStore(rdb, time.Minute).Init(ctx, voucherID, roomUnits, 1); err != nil {
		return outcome{}, err
	}
	st := &roomStack{rdb: rdb, store: room.NewStore(rdb), sale: sale, keys: stock.KeysOf(voucherID)}
	for u := int64(1); u <= roomBuyers; u++ {
		if _, err := st.store.Join(ctx, sale, u); err != nil {
			return outcome{}, err
		}
	}
	time.Sleep(time.Until(sale.Begin) + 10*time.Millisecond)

	errs := make([]error, roomAdmitters)
	race(roomAdmitters, func(i int, pause func()) { errs[i] = admit(ctx, st, pause) })
	for _, err := range errs {
		if err != nil {
			return outcome{}, err
		}
	}
	held, err := rdb.ZCard(ctx, st.keys.Admitted).Result()
	if err != nil {
		return outcome{}, err
	}
	twice := max(int(held)-roomUnits, 0)
	return outcome{
		violations: twice,
		summary:    fmt.Sprintf("%d admitters at once: %s hold %s", roomAdmitters, plural(int(held), "buyer"), plural(roomUnits, "unit")),
		measures:   map[string]int{"held": int(held), "units": roomUnits},
	}, nil
}

// admitTwoSteps reads how many units are free, then admits the next
// number if any is: two commands, with the other admitters in between.
func admitTwoSteps(ctx context.Context, st *roomStack, pause func()) error {
	rdb := st.rdb
	left, err := rdb.Get(ctx, st.keys.Stock).Int64()
	if err != nil {
		return err
	}
	held, err := rdb.ZCard(ctx, st.keys.Admitted).Result()
	if err != nil {
		return err
	}
	free := left - held

	pause() // the lab: every admitter has counted before anyone admits

	if free <= 0 {
		return nil
	}
	// The next buyer in line (the lab's line is simply 1, 2, 3, ...).
	next, err := rdb.HIncrBy(ctx, stock.KeyOf(voucherID, "lab:serving"), "n", 1).Result()
	if err != nil {
		return err
	}
	until := time.Now().Add(st.sale.HoldFor).UnixMilli()
	return rdb.ZAdd(ctx, st.keys.Admitted, redis.Z{Score: float64(until), Member: next}).Err()
}

// admitOneScript is the project's admission: admit.lua counts and admits
// in one step.
func admitOneScript(ctx context.Context, st *roomStack, pause func()) error {
	pause() // the same moment for everyone; nothing to split
	_, err := st.store.Admit(ctx, st.sale)
	return err
}
