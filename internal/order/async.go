package order

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/apperr"
	"seckill/internal/idworker"
	"seckill/internal/stock"
	"seckill/internal/voucher"
)

// Async mode: the request path never waits for MySQL. One Lua script takes
// the unit, remembers the buyer and appends the order to a Redis Stream; a
// consumer group (package order/queue) writes the stream to MySQL in
// batches. A 200 then promises that the order is in Redis, as durable as
// Redis is (run it with an append-only file), and in MySQL within moments.
//
// There is a stream per shard (stock.Shards), and a voucher's orders go to
// its shard's, which shares the voucher's hash tag: the accept script
// touches one Redis Cluster slot.

var (
	//go:embed accept.lua
	acceptSrc    string
	acceptScript = redis.NewScript(acceptSrc)
)

// ErrIDsExhausted means the day's 4,294,967,295 order IDs are used up.
var ErrIDsExhausted = apperr.New(apperr.Busy, "no order IDs left today")

// asyncMode accepts the order in Redis and leaves writing it to the
// consumers of the stream (package order/queue): a 200 is an order in Redis, in MySQL
// within moments.
type asyncMode struct{ *Service }

// place is guard 2 of async mode: take the unit and queue the order in one
// step. There is no hold: the stream entry is the record of the unit taken.
func (m asyncMode) place(ctx context.Context, v *voucher.Voucher, userID int64) (int64, error) {
	s := m.Service
	voucherID := v.ID
	if v.Parts() > 1 {
		// Made by an instance in sync mode (async ones refuse to): its
		// units lie in several slots, and accept.lua sees one.
		return 0, apperr.Down(fmt.Errorf("voucher %d is split into %d buckets, which async mode does not sell", voucherID, v.Parts()))
	}
	// The ID is drawn first, from the instance's pool (most often without
	// a round trip), because the script records the order under it; if
	// the order is not accepted the ID goes back to the pool.
	id, err := s.pool.Next(ctx)
	if err != nil {
		return 0, s.idError(err)
	}
	for attempt := 0; ; attempt++ {
		k := stock.KeysOf(voucherID)
		void := voidKey(voucherID)
		shard := stock.ShardOf(voucherID)
		keys := []string{k.Stock, k.Buyers, StreamKey(shard), PendingKey(shard), AcceptedKey(voucherID), void, QueuedKey(voucherID)}
		start := time.Now()
		code, err := acceptScript.Run(ctx, s.rdb, keys, userID, voucherID, s.now().UnixMilli(), id).Int()
		s.obs.Stage(StageStock, time.Since(start))
		if err != nil {
			// Nothing accepted; or, if only the answer was lost, an order
			// accepted that the buyer must be told of. Ask. The ID is
			// not given back: it may be in use.
			return m.lostAccept(ctx, voucherID, userID, void, err)
		}
		// accept.lua answers with take.lua's codes, and one of its own.
		res := stock.Result(code)
		if res == stock.Taken {
			s.rememberBuyer(voucherID, userID, false)
			return id, nil
		}
		if res != stock.Missing {
			s.pool.Return(id)
		}
		switch res {
		case stock.SoldOut:
			s.rememberSoldOut(voucherID)
			return 0, ErrSoldOut
		case stock.AlreadyBought:
			s.rememberBuyer(voucherID, userID, false) // a dead letter may free them
			return 0, ErrAlreadyOrdered
		case acceptVoided:
			return 0, apperr.Down(errors.New("accept order: declared lost before it ran"))
		case stock.Missing:
			if err := s.restore(ctx, voucherID, 1, attempt); err != nil {
				s.pool.Return(id)
				return 0, err
			}
			continue
		}
		return 0, fmt.Errorf("accept order: unknown answer %d from the script", code)
	}
}

// acceptVoided is accept.lua's answer when lost.lua voided the request
// before it ran.
const acceptVoided stock.Result = 8

var (
	//go:embed lost.lua
	lostSrc    string
	lostScript = redis.NewScript(lostSrc)
)

// voidKey names a fresh void mark for one accept request (see lost.lua).
func voidKey(voucherID int64) string {
	return stock.KeyOf(voucherID, "void:"+strconv.FormatUint(rand.Uint64(), 36))
}

// voidFor is how long a void mark outlives its request: longer than a
// request could plausibly sit in a stalled connection.
const voidFor = 10 * time.Minute

// lostAccept answers a request whose accept script failed without an
// answer. It asks Redis whether the user's order was accepted (then the
// buyer gets 200 and its ID, as the script would have said), and if not,
// voids the request, so that a 503 keeps its promise that nothing was
// taken. Redis may be away for a while: it asks until WriteTimeout, and
// only if it never got an answer is the 503 uncertain (logged).
func (m asyncMode) lostAccept(ctx context.Context, voucherID, userID int64, void string, cause error) (int64, error) {
	s := m.Service
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.WriteTimeout)
	defer cancel()
	keys := []string{AcceptedKey(voucherID), void}
	delay := 20 * time.Millisecond
	for {
		v, err := lostScript.Run(ctx, s.rdb, keys, userID, voidFor.Milliseconds()).Result()
		switch {
		case errors.Is(err, redis.Nil):
			return 0, apperr.Down(fmt.Errorf("accept order: %w (not accepted)", cause))
		case err == nil:
			id, err := idworker.FromScript(v)
			if err != nil {
				return 0, err
			}
			s.rememberBuyer(voucherID, userID, false)
			return id, nil
		}
		if ctx.Err() != nil {
			s.log.Warn("accept order: answer lost and Redis not reachable to ask; the order may have been accepted",
				"voucher", voucherID, "user", userID, "err", cause)
			return 0, apperr.Down(fmt.Errorf("accept order: %w", cause))
		}
		sleep(ctx, delay)
		delay = min(2*delay, 500*time.Millisecond)
	}
}

// stillPending keeps the order IDs of shard whose marker still says
// pending.
func (s *Service) stillPending(ctx context.Context, shard int, ids []int64) ([]int64, error) {
	var out []int64
	for chunk := range slices.Chunk(ids, 1000) {
		fields := make([]string, len(chunk))
		for i, id := range chunk {
			fields[i] = strconv.FormatInt(id, 10)
		}
		vals, err := s.rdb.HMGet(ctx, PendingKey(shard), fields...).Result()
		if err != nil {
			return nil, fmt.Errorf("read pending markers: %w", err)
		}
		for i, v := range vals {
			str, _ := v.(string)
			if p, ok := parsePending(str); ok && p.Status == StatusPending {
				out = append(out, chunk[i])
			}
		}
	}
	return out, nil
}

// pending is an accepted order not yet written to MySQL.
type pending struct {
	UserID, VoucherID int64
	At                time.Time
	Status            string
}

func parsePending(v string) (pending, bool) {
	f := strings.Split(v, ":")
	if len(f) != 4 {
		return pending{}, false
	}
	u, err1 := strconv.ParseInt(f[0], 10, 64)
	vid, err2 := strconv.ParseInt(f[1], 10, 64)
	ms, err3 := strconv.ParseInt(f[2], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return pending{}, false
	}
	return pending{UserID: u, VoucherID: vid, At: time.UnixMilli(ms).UTC(), Status: f[3]}, true
}

// accepted looks an order up among the accepted ones not yet in MySQL,
// in every shard: the ID does not tell the voucher.
func (m asyncMode) accepted(ctx context.Context, id int64) (*Order, error) {
	s := m.Service
	pipe := s.rdb.Pipeline()
	found := make([]*redis.StringCmd, stock.Shards)
	for k := range found {
		found[k] = pipe.HGet(ctx, PendingKey(k), strconv.FormatInt(id, 10))
	}
	pipe.Exec(ctx) // each command's own error is read below
	v := ""
	for _, f := range found {
		if err := answered(f); err != nil {
			return nil, fmt.Errorf("find pending order %d: %w", id, err)
		}
		if f.Err() == nil {
			v = f.Val()
		}
	}
	if v == "" {
		return nil, nil
	}
	p, ok := parsePending(v)
	if !ok {
		return nil, fmt.Errorf("find pending order %d: malformed %q", id, v)
	}
	return &Order{ID: id, UserID: p.UserID, VoucherID: p.VoucherID, Status: p.Status, CreatedAt: p.At}, nil
}

// stockAt reads the voucher's stock and buyers in MySQL and counts in the
// orders still in the stream, not yet written, all as of one moment: their
// units are taken and their users have bought. A reload after Redis lost
// the stock key that missed them would sell their units again and let
// their buyers order twice.
//
// The stream is read first and MySQL second, in one transaction: an entry
// written to MySQL before the snapshot is in the snapshot; one written
// after it is counted as queued. No entry for the voucher can be added
// meanwhile, because its stock key is missing.
func (m asyncMode) stockAt(ctx context.Context, voucherID int64) (left int64, buyers []int64, err error) {
	s := m.Service
	var ids []int64
	users := map[int64]int64{} // order ID -> user
	shard := stock.ShardOf(voucherID)
	err = eachEntry(ctx, s.rdb, StreamKey(shard), func(m redis.XMessage) {
		o, err := ParseEntry(m)
		if err == nil && o.VoucherID == voucherID {
			ids = append(ids, o.ID)
			users[o.ID] = o.UserID
		}
	})
	if err != nil {
		return 0, nil, fmt.Errorf("read stream: %w", err)
	}
	// A dead-lettered entry stays in the stream until trimmed, but its
	// order will never be written: only entries still marked pending count.
	ids, err = s.stillPending(ctx, shard, ids)
	if err != nil {
		return 0, nil, err
	}
	left, buyers, written, err := snapshotWith(ctx, s.db, voucherID, ids)
	if err != nil {
		return 0, nil, err
	}
	for _, id := range ids {
		if !written[id] {
			left--
			buyers = append(buyers, users[id])
		}
	}
	return left, buyers, nil
}

// quiet reports whether every order of voucherID accepted in the
// stream has been written: its count of queued orders is zero, and, if the
// stream holds entries at all, the consumer group exists. A stream without
// the group is not quiet: after Redis restarted empty, accept.lua
// recreates the stream (and the count) before any consumer recreates the
// group, and orders wait that nobody has seen.
func (m asyncMode) quiet(ctx context.Context, voucherID int64) (bool, error) {
	s := m.Service
	pipe := s.rdb.Pipeline()
	queued := pipe.Get(ctx, QueuedKey(voucherID))
	length := pipe.XLen(ctx, StreamKey(stock.ShardOf(voucherID)))
	pipe.Exec(ctx) // each command's own error is read below
	if err := errors.Join(answered(queued), answered(length)); err != nil {
		return false, err
	}
	if n, _ := queued.Int64(); n > 0 {
		return false, nil
	}
	if length.Val() == 0 {
		return true, nil
	}
	groups, err := s.rdb.XInfoGroups(ctx, StreamKey(stock.ShardOf(voucherID))).Result()
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(groups, func(g redis.XInfoGroup) bool { return g.Name == GroupName }), nil
}

// answered returns cmd's error unless it is redis.Nil (a key that does
// not exist, which is an answer). A pipeline's Exec reports only its first
// error: a Nil there would hide a failure of a later command, so each
// command is asked.
func answered(cmd redis.Cmder) error {
	if err := cmd.Err(); err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	return nil
}

// IDFloor is the idworker.Floor of order IDs: the highest sequence number
// among the orders in MySQL and those in Redis' streams (accepted, or
// dead-lettered and perhaps replayed later) with an ID in [lo, hi). After
// Redis lost the day's sequence, it restarts above this, so no ID a 200
// gave out is given again.
//
// In MySQL it reads the highest ID (the primary key's last entry), then
// the highest sequence among the IDs of the two minutes before it: with
// clocks that disagree, an instance a little behind may have made a later
// sequence number under an earlier second. Both reads are primary-key
// ranges, not a scan of the day's orders.
func IDFloor(db *gorm.DB, rdb redis.UniversalClient) idworker.Floor {
	return func(ctx context.Context, prefix string, lo, hi int64) (int64, error) {
		if prefix != orderIDPrefix {
			return 0, fmt.Errorf("order.IDFloor knows only the %q sequence, not %q", orderIDPrefix, prefix)
		}
		const mask, skew = 1<<32 - 1, 120 // seconds
		var last, top int64
		err := db.WithContext(ctx).Raw("SELECT COALESCE(MAX(id), 0) FROM voucher_orders WHERE id >= ? AND id < ?", lo, hi).Scan(&last).Error
		if err == nil && last > 0 {
			from := max(lo, (last>>32-skew)<<32)
			err = db.WithContext(ctx).Raw("SELECT COALESCE(MAX(id & ?), 0) FROM voucher_orders WHERE id >= ? AND id < ?", mask, from, hi).Scan(&top).Error
		}
		if err != nil {
			return 0, fmt.Errorf("highest order ID in MySQL: %w", err)
		}
		var keys []string
		for k := range stock.Shards {
			keys = append(keys, StreamKey(k), DeadKey(k))
		}
		for _, key := range keys {
			err := eachEntry(ctx, rdb, key, func(m redis.XMessage) {
				str, _ := m.Values["id"].(string)
				if id, err := strconv.ParseInt(str, 10, 64); err == nil && id >= lo && id < hi {
					top = max(top, id&mask)
				}
			})
			if err != nil {
				return 0, fmt.Errorf("highest order ID in %s: %w", key, err)
			}
		}
		return top, nil
	}
}

// eachEntry calls fn with every entry of the stream key, oldest first, a
// thousand at a time.
func eachEntry(ctx context.Context, rdb redis.UniversalClient, key string, fn func(redis.XMessage)) error {
	from := "-"
	for {
		msgs, err := rdb.XRangeN(ctx, key, from, "+", 1000).Result()
		if err != nil {
			return err
		}
		for _, m := range msgs {
			fn(m)
		}
		if len(msgs) < 1000 {
			return nil
		}
		from = "(" + msgs[len(msgs)-1].ID
	}
}
