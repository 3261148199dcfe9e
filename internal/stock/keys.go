package stock

import (
	"strconv"
)

// This file names a voucher's keys (KeysOf, KeyOf), and the index of the
// vouchers that have them. It uses shard.go only; buckets.go builds on it,
// never the other way round.

// Keys names one voucher's keys (or one bucket's: see buckets.go).
type Keys struct {
	Stock, Buyers, Holds string
	// Claims: user -> deadline, buyers of a bucketed voucher whose unit
	// came from another bucket than their home. Always empty with one
	// bucket.
	Claims string
	// Returned: the orders whose unit came back to this bucket after a
	// cancel or a refund (returns.go), so that each comes back once.
	Returned string
	// Admitted: user -> the end of their hold, in ms: the buyers a
	// waiting room admitted (package room, which owns the room's other
	// keys). take.lua sells a room's voucher only to a buyer whose hold
	// has not ended, and Confirm ends the hold. Always empty without a
	// room, and for a voucher split into buckets (a room needs one).
	Admitted string
	// Dropped: user -> order ID, a buyer's order whose unit came from
	// another bucket and that async mode dead-lettered (DropBuyer), so
	// that a close of its claim, still to come, forgets the buyer instead
	// of remembering them (KeepClaim), and so that the order's entry, if
	// a level-7 instance began its dead letter and left no note, is never
	// written (DropNotes); and order@entry -> a note, that stream entry's
	// buyer forgotten, so that the entry is never written after all
	// (DropNotes). Always empty in sync mode.
	Dropped string
}

// KeysOf builds the keys of voucher id, of a voucher in one bucket. This
// and BucketKeys are the only places that spell them.
func KeysOf(id int64) Keys {
	return Keys{Stock: KeyOf(id, "stock"), Buyers: KeyOf(id, "buyers"), Holds: KeyOf(id, "holds"), Claims: KeyOf(id, "claims"), Returned: KeyOf(id, "returned"), Dropped: KeyOf(id, "dropped"), Admitted: KeyOf(id, "room:admitted")}
}

// KeyOf names another key of voucher id, in the same Redis Cluster slot as
// its stock keys (its shard's), so that one script may touch them all.
func KeyOf(id int64, name string) string {
	return ShardKey(ShardOf(id), "v"+strconv.FormatInt(id, 10)+":"+name)
}

// all are the keys take.lua and claim.lua are given.
func (k Keys) all() []string { return []string{k.Stock, k.Buyers, k.Holds, k.Claims} }

// indexKey lists the vouchers that have stock keys, for the sweeper.
const indexKey = "seckill:vouchers"
