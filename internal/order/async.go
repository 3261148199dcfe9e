package order

import (
	"context"
	"errors"
	"fmt"
	"time"

	"seckill/internal/apperr"
	"seckill/internal/order/queue"
	"seckill/internal/stock"
	"seckill/internal/voucher"
)

// Async mode: the request path never waits for MySQL. One Lua script takes
// the unit, remembers the buyer and appends the order to a Redis Stream
// (package order/queue, which owns the stream end to end); a consumer
// group writes the stream to MySQL in batches, through QueueWriter
// (persist.go). A 200 then promises that the order is in Redis, as durable
// as Redis is (run it with an append-only file), and in MySQL within
// moments.

// asyncMode accepts the order in Redis and leaves writing it to the
// consumers of the stream: a 200 is an order in Redis, in MySQL within
// moments.
type asyncMode struct {
	common
	queue  *queue.Queue
	stocks *stock.Store
}

// place is guard 2 of async mode: take the unit and queue the order in one
// step. There is no hold: the stream entry is the record of the unit taken.
// A voucher split into buckets takes a unit from the user's home bucket,
// or, once that is empty, from another, with the user claimed at home
// first (queue.Accept).
func (m asyncMode) place(ctx context.Context, v *voucher.Voucher, userID int64) (int64, error) {
	voucherID := v.ID
	// The ID is drawn first, from the instance's pool (most often without
	// a round trip), because the script records the order under it; if
	// the order is not accepted the ID goes back to the pool.
	id, err := m.pool.Next(ctx)
	if err != nil {
		return 0, idError(err, m.now())
	}
	e := queue.Entry{OrderID: id, UserID: userID, VoucherID: voucherID, At: m.now(), Buckets: v.Parts(), Room: v.HasRoom()}
	start := time.Now()
	res, err := m.queue.Accept(ctx, &e)
	m.obs.Stage(StageStock, time.Since(start))
	switch {
	case errors.Is(err, queue.ErrRefused):
		// Redis refused the script (full, say): nothing accepted, for
		// certain, and nothing to ask.
		m.pool.Return(id)
		return 0, apperr.Down(err)
	case err != nil:
		// Nothing accepted; or, if only the answer was lost, an order
		// accepted that the buyer must be told of. Ask. The ID is
		// not given back: it may be in use.
		return m.lost(ctx, e, err)
	}
	if res != queue.Queued && res != queue.Voided {
		// Unused: another request may have it. Not a voided one, though:
		// its void mark (named after the ID) lives on, and would void that
		// request too.
		m.pool.Return(id)
	}
	switch res {
	case queue.Queued:
		m.memory.rememberBuyer(voucherID, userID, false)
		return id, nil
	case queue.SoldOut:
		m.memory.rememberSoldOut(voucherID)
		return 0, ErrSoldOut
	case queue.AlreadyBought:
		m.memory.rememberBuyer(voucherID, userID, false) // a dead letter may free them
		return 0, ErrAlreadyOrdered
	case queue.AlreadyBuying:
		return 0, busyRetry() // the other request may yet fail: try again
	case queue.Voided:
		return 0, apperr.Down(errors.New("accept order: declared lost before it ran"))
	case queue.Lapsed:
		return 0, apperr.Down(errors.New("accept order: the request stalled past its claim; nothing was taken"))
	case queue.StockMissing:
		return 0, errStockMissing
	case queue.NotAdmitted:
		return 0, ErrNotAdmitted
	}
	return 0, fmt.Errorf("accept order: unknown answer %d from the script", res)
}

// lost answers a request whose accept script failed without an answer:
// 200 and the order's ID if Redis holds it, else 503, with the request
// voided so that the 503 keeps its promise that nothing was taken
// (queue.Lost). Redis may be away for a while: it is asked until
// WriteTimeout, and only if it never answered is the 503 uncertain
// (logged).
func (m asyncMode) lost(ctx context.Context, e queue.Entry, cause error) (int64, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.WriteTimeout)
	defer cancel()
	id, accepted, err := m.queue.Lost(ctx, e)
	switch {
	case errors.Is(err, queue.ErrUnknown):
		m.log.Warn("accept order: answer lost and Redis not reachable to ask; the order may have been accepted",
			"voucher", e.VoucherID, "user", e.UserID, "err", cause)
		return 0, apperr.Down(fmt.Errorf("accept order: %w", cause))
	case err != nil:
		return 0, err
	case !accepted:
		return 0, apperr.Down(fmt.Errorf("accept order: %w (not accepted)", cause))
	}
	m.memory.rememberBuyer(e.VoucherID, e.UserID, false)
	return id, nil
}

// accepted looks an order up among the accepted ones not yet in MySQL.
func (m asyncMode) accepted(ctx context.Context, id int64) (*Order, error) {
	e, failed, found, err := m.queue.Find(ctx, id)
	if err != nil || !found {
		return nil, err
	}
	status := StatusPending
	if failed {
		status = StatusFailed
	}
	return &Order{ID: id, UserID: e.UserID, VoucherID: e.VoucherID, Status: status, CreatedAt: e.At}, nil
}

// stockAt reads the voucher's stock and buyers in MySQL and counts in the
// orders still in the streams, not yet written, all as of one moment:
// their units are taken and their users have bought. A reload after Redis
// lost the stock key that missed them would sell their units again and let
// their buyers order twice.
//
// The streams are read first and MySQL second, in one transaction: an
// entry written to MySQL before the snapshot is in the snapshot; one
// written after it is counted as queued. No entry can be added meanwhile
// in a bucket whose stock key is missing; a voucher split into buckets may
// have lost only some, and the others go on selling: their stock is read
// before anything else (Seen), so that the orders they take meanwhile,
// in no snapshot, do not also leave their units to the lost buckets
// (stock.Store.Load).
func (m asyncMode) stockAt(ctx context.Context, voucherID int64, buckets int) (snapshot, error) {
	var seen []int64
	if buckets > 1 {
		var err error
		if seen, err = m.stocks.Levels(ctx, voucherID, buckets); err != nil {
			return snapshot{}, err
		}
	}
	queued, err := m.queue.Queued(ctx, voucherID, buckets)
	if err != nil {
		return snapshot{}, err
	}
	ids := make([]int64, len(queued))
	for i, e := range queued {
		ids[i] = e.OrderID
	}
	snap, written, err := snapshotWith(ctx, m.truth, voucherID, ids)
	if err != nil {
		return snapshot{}, err
	}
	for _, e := range queued {
		if !written[e.OrderID] {
			snap.Left--
			snap.Buyers = append(snap.Buyers, e.UserID)
		}
	}
	snap.Seen = seen
	return snap, nil
}

// quiet reports whether every order of voucherID accepted in the streams
// has been written (queue.Quiet).
func (m asyncMode) quiet(ctx context.Context, voucherID int64, buckets int) (bool, error) {
	return m.queue.Quiet(ctx, voucherID, buckets)
}

// queuedOf returns the orders users had accepted in Redis (queue.AcceptedOf).
func (m asyncMode) queuedOf(ctx context.Context, voucherID int64, buckets int, users []int64) (map[int64]int64, error) {
	return m.queue.AcceptedOf(ctx, voucherID, buckets, users)
}
