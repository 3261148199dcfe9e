package stock

import (
	"strconv"
)

// This file names the buckets of a split voucher (MaxBuckets, BucketKeys,
// Home) and shares units among them (share). It uses keys.go and shard.go
// only.

// A hot voucher may be split into buckets: its stock is divided among up to
// MaxBuckets sets of keys, each in a slot of its own, so that on a Redis
// Cluster its scripts spread over the masters instead of queueing on the
// one that owns its slot. One Redis runs about 100k scripts a second; a
// voucher in N buckets on N masters can be asked N times as often.
//
// Each user has a home bucket (Home). A request first takes a unit there
// (take.lua, as for an unsplit voucher, which tells a buyer "already
// bought" before it looks at the stock). Only when home is empty does a
// user who has not bought look further: one pipeline reads the other
// buckets' stock, it takes a unit from the next bucket that showed one
// (unit.lua), then claims the user in the home bucket (claim.lua). So:
//
//   - The buyer is remembered in one place only, the home bucket's buyers
//     set, and every request of a user passes through it: take.lua and
//     claim.lua both check it and add to it in one script. Two requests of
//     one user cannot both pass, whichever buckets their units come from;
//     the loser gives its unit back.
//   - No stock is stranded: a request whose home is empty tries every other
//     bucket before it answers sold out, so the last units sell wherever
//     they lie.
//   - A claim is kept like a hold (user -> deadline in the home bucket's
//     claims), so that a request that dies between claiming and writing
//     its order is found by the sweeper, which then forgets the buyer
//     unless the order row exists. The unit taken elsewhere has its own
//     hold in its own bucket, swept the same way.
//
// MySQL's guards (UPDATE ... WHERE stock > 0, the unique (user, voucher)
// index) do not know about buckets: they hold across them as they hold
// across instances.
//
// A voucher of one bucket keeps its shard's keys (KeysOf). Bucket b of a
// voucher of n > 1 lives at the middle of the b-th n-th of the slot space,
// whatever the voucher: on a cluster of n masters with the slots split
// evenly (what redis-cli --cluster create does), one bucket per master.
// Several hot vouchers then share the masters the same way, each spread
// evenly over them.

// MaxBuckets is the most buckets a voucher may have.
const MaxBuckets = 16

// BucketKeys names the keys of bucket b of a voucher of n buckets.
func BucketKeys(voucherID int64, n, b int) Keys {
	if n <= 1 {
		return KeysOf(voucherID)
	}
	w := (2*b + 1) * len(bucketTags) / (2 * n)
	p := "seckill:{" + bucketTags[w] + "}:v" + strconv.FormatInt(voucherID, 10) + ":b" + strconv.Itoa(b) + ":"
	return Keys{Stock: p + "stock", Buyers: p + "buyers", Holds: p + "holds", Claims: p + "claims", Returned: p + "returned"}
}

// Home is the bucket where user is remembered as a buyer of a voucher of
// n buckets, and the first one asked for a unit. Users are spread over
// the buckets by a hash of their ID, so that consecutive IDs (or IDs that
// are all even) spread as well as random ones.
func Home(userID int64, n int) int {
	if n <= 1 {
		return 0
	}
	x := uint64(userID)
	// splitmix64's finalizer: every input bit moves every output bit.
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return int(x % uint64(n))
}

// bucketTags[w] is a hash tag whose slot lies in the w-th of 256 windows of
// 64 slots.
var bucketTags = func() [256]string {
	var tags [256]string
	for w := range tags {
		for i := 0; ; i++ {
			tag := "b" + strconv.Itoa(w) + "." + strconv.Itoa(i)
			if Slot(tag)/64 == w {
				tags[w] = tag
				break
			}
		}
	}
	return tags
}()

// share is bucket b's share of units split over n buckets: the remainder
// goes one each to the first buckets.
func share(units int64, n, b int) int64 {
	s := units / int64(n)
	if int64(b) < units%int64(n) {
		s++
	}
	return s
}
