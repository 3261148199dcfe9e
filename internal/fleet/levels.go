package fleet

// Level is a version's feature level: a small integer that grows by one
// with every version that changed what instances share (keys, tables,
// stream entries) or added a feature an older instance would serve
// wrongly. Two instances with the same level serve the same things the
// same way; the revision tells builds apart, the level tells what they
// can do.
type Level int

// Release is what one level added, as docs/upgrading.md tells it at
// length.
type Release struct {
	Level  Level
	Commit string // the commit that brought it (the first of several, where it took several)
	Added  string
}

// Releases is every level, oldest first. Levels 1 to 7 are named after
// the fact: those versions announce nothing, so no instance of them is
// ever seen in the fleet (see the package doc). Current is the last.
var Releases = []Release{
	{1, "53b170b", "sync and async modes; async orders in one stream, seckill:orders, entries of format " + FormatOrder},
	{2, "a2d51b4", "vouchers in 16 shards: keys seckill:{vN}:..., a stream of orders per shard"},
	{3, "ef1b497", `vouchers split into buckets ("buckets", migration 0002), sold in sync mode`},
	{4, "b3411b6", "the order lifecycle: pay, cancel, refund, expiry (migration 0003)"},
	{5, "92767c1", "buckets in the shards' slots, and split vouchers sold in async mode: entries of format " + FormatBucket},
	{6, "bbc12cd", "payment events compared exactly, a voucher's counts (migrations 0004, 0005)"},
	{7, "eb3ad20", "the waiting room (migration 0006)"},
	{8, "", "instances announce their version in Redis, and refuse what an older one alive cannot serve"},
}

// Current is this version's level.
const Current Level = 8

// The stream entry formats of async mode's orders, as package
// order/queue writes and reads them (accept.lua, parseEntry). An
// instance announces the formats its consumer reads; one whose consumer
// does not read a format must not be sent entries of it.
const (
	// FormatOrder: fields id, user, voucher and at.
	FormatOrder = "order"
	// FormatBucket: FormatOrder's fields, and buckets and bucket: the
	// unit of a voucher split into buckets, queued in its bucket's
	// shard's stream. A consumer of level 4 or below reads such an
	// entry as malformed and dead-letters it without settling anything.
	FormatBucket = "order+bucket"
)

// Reads is the formats this version's consumer reads.
var Reads = []string{FormatOrder, FormatBucket}

// A Need is a feature that only instances of some level serve: creating
// one is refused while an instance below that level is alive (Require).
type Need struct {
	Feature string // for the refusal's message
	Level   Level
	// Reads, if not empty, is a stream entry format the feature's orders
	// are queued in: an async instance must read it too.
	Reads string
}

// The features an older instance cannot serve.
var (
	// SplitInAsync is a voucher split into buckets, made by an instance
	// in async mode: an older consumer would dead-letter its orders.
	SplitInAsync = Need{Feature: "a voucher split into buckets in async mode", Level: 5, Reads: FormatBucket}
	// Room is a voucher with a waiting room: an older instance would
	// sell it to anyone, admitted or not.
	Room = Need{Feature: "a voucher with a waiting room", Level: 7}
)
