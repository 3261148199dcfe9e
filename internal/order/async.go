package order

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/apperr"
	"seckill/internal/idworker"
	"seckill/internal/stock"
)

// Async mode: the request path never waits for MySQL. One Lua script takes
// the unit, remembers the buyer and appends the order to a Redis Stream; a
// consumer group (queue.go) writes the stream to MySQL in batches. A 200
// then promises that the order is in Redis, as durable as Redis is (run it
// with an append-only file), and in MySQL within moments.
//
// The stream is one for all vouchers, so the accept script touches keys of
// several vouchers' slots: on Redis Cluster, shard it per voucher with the
// voucher's hash tag.

// Redis keys of async mode.
const (
	streamKey  = "seckill:orders"         // accepted orders, oldest first
	deadKey    = "seckill:orders:dead"    // entries that could not be written
	pendingKey = "seckill:orders:pending" // order ID -> user:voucher:ms:status
	groupName  = "persist"                // the one consumer group
)

var (
	//go:embed accept.lua
	acceptSrc    string
	acceptScript = redis.NewScript(idworker.LuaNextID + acceptSrc)
)

// ErrIDsExhausted means the day's 4,294,967,295 order IDs are used up.
var ErrIDsExhausted = apperr.New(apperr.Busy, "no order IDs left today")

// accept is guard 2 of async mode: take the unit and queue the order in one
// step. There is no hold: the stream entry is the record of the unit taken.
func (s *Service) accept(ctx context.Context, voucherID, userID int64) (int64, error) {
	for attempt := 0; ; attempt++ {
		now := s.now()
		slot, err := idworker.SlotAt(orderIDPrefix, now)
		if err != nil {
			return 0, err
		}
		k := stock.KeysOf(voucherID)
		keys := []string{k.Stock, k.Buyers, slot.Key, streamKey, pendingKey}
		res, err := acceptScript.Run(ctx, s.rdb, keys, userID, voucherID, now.UnixMilli(), slot.Hi, slot.Lo).Slice()
		if err != nil {
			// Nothing taken; or, if only the reply was lost, an order
			// accepted that the client does not know of.
			return 0, apperr.Down(fmt.Errorf("accept order: %w", err))
		}
		switch code, _ := res[0].(int64); code {
		case 0:
			id, err := idworker.FromScript(res[1])
			if err != nil {
				return 0, err
			}
			s.rememberBuyer(voucherID, userID)
			return id, nil
		case 1:
			s.rememberSoldOut(voucherID)
			return 0, ErrSoldOut
		case 2:
			s.rememberBuyer(voucherID, userID) // accepted orders are never given back
			return 0, ErrAlreadyOrdered
		case 6:
			return 0, ErrIDsExhausted
		}
		if attempt == 2 {
			return 0, apperr.Down(fmt.Errorf("stock of voucher %d still missing after reloading", voucherID))
		}
		if err := s.reload(ctx, voucherID); err != nil {
			return 0, err
		}
	}
}

// stillPending keeps the order IDs whose marker still says pending.
func (s *Service) stillPending(ctx context.Context, ids []int64) ([]int64, error) {
	var out []int64
	for chunk := range slices.Chunk(ids, 1000) {
		fields := make([]string, len(chunk))
		for i, id := range chunk {
			fields[i] = strconv.FormatInt(id, 10)
		}
		vals, err := s.rdb.HMGet(ctx, pendingKey, fields...).Result()
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

// findPending looks an order up among the accepted ones not yet in MySQL.
func (s *Service) findPending(ctx context.Context, id int64) (*Order, error) {
	v, err := s.rdb.HGet(ctx, pendingKey, strconv.FormatInt(id, 10)).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("find pending order %d: %w", id, err)
	}
	p, ok := parsePending(v)
	if !ok {
		return nil, fmt.Errorf("find pending order %d: malformed %q", id, v)
	}
	return &Order{ID: id, UserID: p.UserID, VoucherID: p.VoucherID, Status: p.Status, CreatedAt: p.At}, nil
}

// queued returns the orders of voucherID that are in the stream but not
// yet in MySQL, with the voucher's MySQL stock and buyers, all as of one
// moment. A reload after Redis lost the stock key must subtract them, or it
// would sell their units again and let their buyers order twice.
//
// The stream is read first and MySQL second, in one transaction: an entry
// written to MySQL before the snapshot is in the snapshot; one written
// after it is counted as queued. No entry for the voucher can be added
// meanwhile, because its stock key is missing.
func (s *Service) queued(ctx context.Context, _ *gorm.DB, voucherID int64) (left int64, buyers []int64, err error) {
	var ids []int64
	users := map[int64]int64{} // order ID -> user
	from := "-"
	for {
		msgs, err := s.rdb.XRangeN(ctx, streamKey, from, "+", 1000).Result()
		if err != nil {
			return 0, nil, fmt.Errorf("read stream: %w", err)
		}
		for _, m := range msgs {
			o, err := parseEntry(m)
			if err == nil && o.VoucherID == voucherID {
				ids = append(ids, o.ID)
				users[o.ID] = o.UserID
			}
		}
		if len(msgs) < 1000 {
			break
		}
		from = "(" + msgs[len(msgs)-1].ID
	}
	// A dead-lettered entry stays in the stream until trimmed, but its
	// order will never be written: only entries still marked pending count.
	ids, err = s.stillPending(ctx, ids)
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
