package stock

import (
	"strconv"
)

// This file spreads vouchers over shards and names the shards' keys
// (Shards, ShardOf, ShardKey, Slot). It uses no other file of the package.

// Vouchers are spread over a fixed number of shards, and a voucher's keys
// carry its shard's hash tag. On one Redis that changes nothing. On a
// Redis Cluster, where a Lua script may only touch keys of one slot, it is
// what lets async mode's accept script take a unit (the voucher's keys)
// and queue the order (its shard's stream, package order) in one atomic
// step, while the vouchers, and so the work, still spread over the masters.
// Shards, not one stream per voucher: a consumer reads each stream, and
// sixteen readers serve any number of vouchers.
//
// The count is part of the key layout: every instance must agree on it,
// and changing it moves every key (stock reloads from MySQL by itself;
// orders still queued in the old streams would wait unread).
const Shards = 16

// ShardOf is the shard of a voucher.
func ShardOf(voucherID int64) int { return int(uint64(voucherID) % Shards) }

// ShardKey names a key of shard k: seckill:{<k's tag>}:name.
func ShardKey(k int, name string) string { return "seckill:{" + shardTags[k] + "}:" + name }

// shardTags are the shards' hash tags, chosen so that the shards' slots
// spread evenly over the 16,384 slots: shard k's in the k-th sixteenth. A
// cluster splits the slots into contiguous ranges, one or more per master,
// so the shards divide among the masters as evenly as the ranges do.
// Tags named s0, s1, ... would land where CRC16 puts them, unevenly.
var shardTags = func() [Shards]string {
	var tags [Shards]string
	const width = 16384 / Shards
	for k := range tags {
		for n := 0; ; n++ {
			tag := "s" + strconv.Itoa(k) + "." + strconv.Itoa(n)
			if slot := Slot(tag); slot/width == k {
				tags[k] = tag
				break
			}
		}
	}
	return tags
}()

// Slot is the Redis Cluster slot of a key with no hash tag, or of a hash
// tag itself: CRC16 (XMODEM) of it, modulo 16384, as Redis computes it.
func Slot(key string) int {
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}
