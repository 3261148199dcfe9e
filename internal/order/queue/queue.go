// Package queue is async mode's orders queue, end to end: the Redis Stream
// in which an accepted order waits until it is a row in MySQL.
//
//   - accept.go: one script takes a unit of the voucher (package stock's
//     keys), remembers the buyer and appends the order to the stream, in
//     one step; when its answer is lost, Redis is asked whether it ran.
//   - consumer.go: a consumer group writes the stream to MySQL in
//     batches, through a Writer, acknowledging only what was committed,
//     claiming what dead consumers held, and backing off while MySQL
//     cannot write; consumer_read.go is what it reads, consumer_write.go
//     how it writes and acknowledges.
//   - deadletters.go: the entries MySQL refused for good, settled at once
//     and kept for an admin to list and replay.
//   - orders.go: what the rest of the service asks of the queue: an order
//     not yet written, a voucher's orders on their way, whether a voucher
//     is quiet, every order ID in the streams.
//   - stats.go and handler.go: the admin's view of it all.
//
// It knows nothing of MySQL. Package order sells, and hands the consumer
// a Writer that writes a batch and says what became of it; the arrow runs
// one way, from order to queue.
//
// There is a stream per shard of vouchers (stock.Shards), with the
// shard's hash tag: a voucher's orders go to its shard's stream, in the
// same Redis Cluster slot as the voucher's own keys, so that every script
// here touches one slot. A voucher split into buckets (package stock,
// buckets.go) has each bucket in a shard's slot of its own: an order goes
// to the stream of the bucket its unit came from, and the buyer is
// claimed in their home bucket first when that is another (accept.go).
package queue

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/stock"
)

// Queue is the orders queue in Redis: accepting, looking up, dead
// letters, statistics. The consumers that empty it are Consumers. It is
// safe for concurrent use.
type Queue struct {
	rdb    redis.UniversalClient
	stocks *stock.Store // claims of buyers whose unit comes from another bucket
}

// New returns the Queue kept in rdb, whose vouchers' stock is stocks'.
func New(rdb redis.UniversalClient, stocks *stock.Store) *Queue {
	return &Queue{rdb: rdb, stocks: stocks}
}

// GroupName is the consumer group of every stream.
const GroupName = "persist"

// The keys of the queue: one stream, one set of dead letters and one hash
// of pending markers per shard, and per voucher (per bucket of a split
// one) the two keys the scripts keep beside its stock. This is the only
// place that spells them.

// StreamKey names shard k's stream of accepted orders, oldest first.
func StreamKey(k int) string { return stock.ShardKey(k, "orders") }

// deadKey names shard k's dead letters: entries that could not be written.
func deadKey(k int) string { return stock.ShardKey(k, "orders:dead") }

// pendingKey names shard k's hash of orders not yet written: order ID ->
// user:voucher:ms:status (status pending, or failed once dead-lettered).
func pendingKey(k int) string { return stock.ShardKey(k, "orders:pending") }

// acceptedKey names the bucket's accepted orders: user -> order ID,
// written in the same step as the order, read when its answer was lost.
func (e Entry) acceptedKey() string { return e.key("accepted") }

// queuedKey names the bucket's count of accepted orders not yet written
// (accept.lua adds, ack.lua and dead.lua take off).
func (e Entry) queuedKey() string { return e.key("queued") }

// voidKey names the void mark of the request that tried to queue e's
// order in e's bucket (see lost.lua). An order ID whose answer was lost is
// never drawn again, so the mark is that request's alone.
func (e Entry) voidKey() string { return e.key("void:" + strconv.FormatInt(e.OrderID, 10)) }

// key names a key of e's bucket of its voucher.
func (e Entry) key(name string) string {
	return stock.BucketKey(e.VoucherID, e.Buckets, e.Bucket, name)
}

// shard is the shard whose stream e is in: its bucket's.
func (e Entry) shard() int { return stock.BucketShard(e.VoucherID, e.Buckets, e.Bucket) }

// VoucherKeys are the queue's keys of one voucher of n buckets, for
// whoever lets a voucher's keys expire once its sale is over (the
// sweeper).
func VoucherKeys(voucherID int64, n int) []string {
	var keys []string
	for b := range max(n, 1) {
		e := Entry{VoucherID: voucherID, Buckets: n, Bucket: b}
		keys = append(keys, e.acceptedKey(), e.queuedKey())
	}
	return keys
}

// An Entry is an accepted order, as the stream holds it.
type Entry struct {
	OrderID, UserID, VoucherID int64
	At                         time.Time // when it was accepted, to the millisecond
	// Buckets is the voucher's count of buckets (0 or 1: not split), and
	// Bucket the one its unit came from, in whose shard's stream the
	// entry is.
	Buckets, Bucket int
	// Room: the voucher has a waiting room (package room), and only a
	// buyer it admitted may take a unit. Never in the stream.
	Room bool

	// claim is the claim of the buyer at home while Accept takes a unit
	// of another bucket (zero otherwise): Lost settles it. Never in the
	// stream.
	claim stock.Claimed
}

// The fields of a stream entry, as accept.lua writes them; the last two
// only for a voucher split into buckets.
const (
	fieldOrder   = "id"
	fieldUser    = "user"
	fieldVoucher = "voucher"
	fieldAt      = "at"
	fieldBuckets = "buckets"
	fieldBucket  = "bucket"
)

// field reads one field of a stream entry ("" if it has none).
func field(m redis.XMessage, name string) string {
	s, _ := m.Values[name].(string)
	return s
}

// parseEntry reads an order from a stream entry.
func parseEntry(m redis.XMessage) (Entry, error) {
	num := func(name string) (int64, error) {
		s := field(m, name)
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 {
			return 0, fmt.Errorf("entry %s: field %s = %q is not a positive integer", m.ID, name, s)
		}
		return n, nil
	}
	id, err1 := num(fieldOrder)
	user, err2 := num(fieldUser)
	voucherID, err3 := num(fieldVoucher)
	at, err4 := num(fieldAt)
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return Entry{}, err
	}
	e := Entry{OrderID: id, UserID: user, VoucherID: voucherID, At: time.UnixMilli(at).UTC(), Buckets: 1}
	if field(m, fieldBuckets) != "" || field(m, fieldBucket) != "" {
		n, err1 := strconv.Atoi(field(m, fieldBuckets))
		b, err2 := strconv.Atoi(field(m, fieldBucket))
		if err1 != nil || err2 != nil || n < 2 || n > stock.MaxBuckets || b < 0 || b >= n {
			return Entry{}, fmt.Errorf("entry %s: bucket %q of %q is not a bucket of 2 to %d", m.ID, field(m, fieldBucket), field(m, fieldBuckets), stock.MaxBuckets)
		}
		e.Buckets, e.Bucket = n, b
	}
	return e, nil
}

// args are an entry's arguments to accept.lua after its keys: replay, a
// dead letter's ID (or ""), and until, the last moment the unit may be
// taken for a buyer claimed in another bucket (0: the buyer is checked
// here, in their home bucket).
func (e Entry) args(replay string, until int64) []any {
	u := ""
	if until > 0 {
		u = strconv.FormatInt(until, 10)
	}
	room := ""
	if e.Room {
		room = "1"
	}
	return []any{e.UserID, e.VoucherID, e.At.UnixMilli(), e.OrderID, replay, max(e.Buckets, 1), e.Bucket, u, room}
}

// keys are accept.lua's keys for e, the last one given.
func (e Entry) keys(last string) []string {
	k := stock.BucketKeys(e.VoucherID, e.Buckets, e.Bucket)
	return []string{k.Stock, k.Buyers, StreamKey(e.shard()), pendingKey(e.shard()), e.acceptedKey(), e.queuedKey(), last, k.Claims, k.Admitted}
}

// home is the bucket where e's user is remembered as a buyer.
func (e Entry) home() int { return stock.Home(e.UserID, e.Buckets) }

// A pending marker (pendingKey) says what became of an accepted order
// until its row exists: pending, or failed once it was dead-lettered.
const (
	markPending = "pending"
	markFailed  = "failed"
)

// parseMarker reads a pending marker: user:voucher:ms:status.
func parseMarker(orderID int64, v string) (e Entry, status string, ok bool) {
	f := strings.Split(v, ":")
	if len(f) != 4 {
		return Entry{}, "", false
	}
	u, err1 := strconv.ParseInt(f[0], 10, 64)
	vid, err2 := strconv.ParseInt(f[1], 10, 64)
	ms, err3 := strconv.ParseInt(f[2], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return Entry{}, "", false
	}
	return Entry{OrderID: orderID, UserID: u, VoucherID: vid, At: time.UnixMilli(ms).UTC()}, f[3], true
}
