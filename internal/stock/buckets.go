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
// voucher of n > 1 lives in a shard of its own (BucketShard): the one
// whose slot lies nearest the middle of the b-th n-th of the slot space,
// whatever the voucher. On a cluster of n masters with the slots split
// evenly (what redis-cli --cluster create does) that is one bucket per
// master, for n from 2 to 9, 11 and 16; for 10 and 12 to 15 masters one
// to four buckets share a master with another (no shard's slot lies in
// their master's range), and the others have one each. Several hot
// vouchers share the masters the same way, each spread over them.
//
// Why shards, rather than any slot: async mode queues an order in the
// stream of the slot its unit came from, in the same script (package
// order/queue), and a stream needs consumers reading it. The shards'
// sixteen streams already have theirs, so a bucket that lives in a
// shard's slot needs none of its own.

// MaxBuckets is the most buckets a voucher may have: one per shard.
const MaxBuckets = Shards

// BucketShard is the shard whose slot bucket b of a voucher of n buckets
// lives in; with one bucket, the voucher's own (ShardOf).
func BucketShard(voucherID int64, n, b int) int {
	if n <= 1 {
		return ShardOf(voucherID)
	}
	return bucketShards[n][b]
}

// BucketKey names another key of bucket b of a voucher of n buckets, in
// the bucket's slot (with one bucket, KeyOf's).
func BucketKey(voucherID int64, n, b int, name string) string {
	if n <= 1 {
		return KeyOf(voucherID, name)
	}
	return ShardKey(bucketShards[n][b], "v"+strconv.FormatInt(voucherID, 10)+":b"+strconv.Itoa(b)+":"+name)
}

// BucketKeys names the keys of bucket b of a voucher of n buckets.
func BucketKeys(voucherID int64, n, b int) Keys {
	if n <= 1 {
		return KeysOf(voucherID)
	}
	k := func(name string) string { return BucketKey(voucherID, n, b, name) }
	return Keys{Stock: k("stock"), Buyers: k("buyers"), Holds: k("holds"), Claims: k("claims"), Returned: k("returned"), Dropped: k("dropped"), Admitted: k("room:admitted")}
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

// bucketShards[n][b] is BucketShard for n > 1, worked out once. First each
// bucket takes the shard nearest its range's middle among those whose
// slot lies in its range, if any; then the buckets left take the nearest
// shard not taken. Distinct shards for distinct buckets, always.
var bucketShards = func() [MaxBuckets + 1][]int {
	var slots [Shards]int
	for k := range slots {
		slots[k] = Slot(shardTags[k])
	}
	var out [MaxBuckets + 1][]int
	for n := 2; n <= MaxBuckets; n++ {
		out[n] = make([]int, n)
		taken := make([]bool, Shards)
		nearest := func(b int, inRange bool) int {
			lo, hi := b*16384/n, (b+1)*16384/n
			mid := (lo + hi) / 2
			best := -1
			for k, s := range slots {
				if taken[k] || (inRange && (s < lo || s >= hi)) {
					continue
				}
				if best < 0 || abs(s-mid) < abs(slots[best]-mid) {
					best = k
				}
			}
			return best
		}
		for b := range n {
			out[n][b] = nearest(b, true)
			if out[n][b] >= 0 {
				taken[out[n][b]] = true
			}
		}
		for b := range n {
			if out[n][b] < 0 {
				out[n][b] = nearest(b, false)
				taken[out[n][b]] = true
			}
		}
	}
	return out
}()

func abs(x int) int { return max(x, -x) }

// share is bucket b's share of units split over n buckets: the remainder
// goes one each to the first buckets.
func share(units int64, n, b int) int64 {
	s := units / int64(n)
	if int64(b) < units%int64(n) {
		s++
	}
	return s
}
