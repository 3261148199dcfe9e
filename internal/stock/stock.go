// Package stock keeps each voucher's sellable stock in Redis, where a
// flash sale's thousands of requests a second can be answered without
// touching MySQL.
//
// Per voucher it keeps these keys, all with the hash tag of the voucher's
// shard (shard.go) so that they live in one Redis Cluster slot and one Lua
// script may touch them all, with the other keys of that shard (async
// mode's stream of orders):
//
//	seckill:{s7.43}:v7:stock   units left
//	seckill:{s7.43}:v7:buyers  users who took a unit (one order per user)
//	seckill:{s7.43}:v7:holds   user -> deadline: units taken whose order
//	                           row is not written yet
//	seckill:{s7.43}:v7:claims  user -> deadline: buyers whose unit came
//	                           from another bucket (empty unless split)
//	seckill:{s7.43}:v7:returned  orders whose unit came back after a
//	                           cancel or a refund
//
// A hot voucher may be split into buckets, each a set of these keys in a
// slot of its own (buckets.go).
//
// A request takes a unit with Take. Once its order row is committed it calls
// Confirm (ConfirmAll closes the holds of orders committed together, as
// sync mode's group commit writes them); if anything fails it calls
// GiveBack. A hold is what makes the unit recoverable when the process
// dies in between (SIGKILL, OOM, power):
// the Sweeper in package order finds expired holds with Expired and returns
// their units with Settle, unless the order row exists after all.
//
// MySQL stays the truth. Redis may lose keys (a flush, a restart without
// persistence): Take then reports Missing and the caller reloads the voucher
// from MySQL with Load.
//
// The package's files, by job. Each uses only files below it in this
// list, and load.go uses neither take.go nor holds.go:
//
//	take.go     Take: a unit for a user, from home or another bucket
//	holds.go    closing holds: Confirm, ConfirmAll, GiveBack, Drop; Expired and
//	            Settle for the sweeper
//	load.go     Redis from MySQL's figures: Init, Load, Reconcile, and
//	            Left, Forget, Vouchers
//	returns.go  a cancelled or refunded order's unit back on sale, once:
//	            Return
//	buckets.go  a split voucher's buckets: BucketKeys, Home, share
//	keys.go     a voucher's keys: Keys, KeysOf, KeyOf
//	shard.go    shards and hash tags: ShardOf, ShardKey, Slot
//	stock.go    this comment, and what they all share: Result, Store, Hold
//
// Each file embeds the Lua scripts it runs, next to the functions that
// run them.
package stock

import (
	"time"

	"github.com/redis/go-redis/v9"
)

// Result is what Take decided.
type Result int

// Take's results; the values are the script's return codes.
const (
	Taken         Result = 0
	SoldOut       Result = 1 // nothing left, and nothing can come back
	AlreadyBought Result = 2 // the user's order is settled
	Missing       Result = 3
	// SoldOutForNow: nothing left, but requests still hold units that
	// come back if they fail.
	SoldOutForNow Result = 4
	// AlreadyBuying: a request of the user holds a unit; if it fails,
	// the user may buy again.
	AlreadyBuying Result = 5
	// NotAdmitted: the voucher has a waiting room (package room), and the
	// user is not admitted, or their hold has ended.
	NotAdmitted Result = 6
)

// Store reads and changes stock in Redis. It is safe for concurrent use.
//
// Every method takes the voucher's bucket count n (1 for a voucher not
// split: see buckets.go); all instances must agree on it, so it is part of
// the voucher's row in MySQL.
type Store struct {
	rdb  redis.UniversalClient
	hold time.Duration
}

// NewStore returns a Store whose holds last hold: longer than any request
// can take between Take and Confirm (the order service bounds that), short
// enough that a dead process's units come back soon.
func NewStore(rdb redis.UniversalClient, hold time.Duration) *Store {
	return &Store{rdb: rdb, hold: hold}
}

// A Hold is a unit Take took for a user: which bucket it came from, and
// the user's home bucket, where they are remembered as a buyer. With one
// bucket both are 0.
type Hold struct {
	Voucher, User int64
	Buckets       int // the voucher's
	Home, From    int
}
