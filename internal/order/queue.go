package order

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"
)

// QueueConfig tunes the consumer that writes accepted orders to MySQL.
type QueueConfig struct {
	Consumer      string        // this consumer's name: stable across restarts of one instance
	Batch         int           // entries read and written at once
	ClaimIdle     time.Duration // an entry pending this long in another consumer is taken over
	MaxDeliveries int64         // deliveries after which a failing entry goes to the dead letters
}

// DefaultQueueConfig is a good start.
var DefaultQueueConfig = QueueConfig{Batch: 500, ClaimIdle: 5 * time.Second, MaxDeliveries: 5}

// Persister is one consumer of the group that writes the orders stream to
// MySQL. Each server instance runs one, named so that a restarted instance
// finds its own unacknowledged entries again.
//
// At-least-once: an entry is acknowledged only after its transaction
// commits, so a crash between the two redelivers it, and writing an entry
// twice is a no-op (the order ID is the primary key, checked first).
type Persister struct {
	svc *Service
	cfg QueueConfig
	log *slog.Logger

	claimCursor string // XAUTOCLAIM's cursor, carried from call to call
}

// NewPersister returns a Persister for svc's stream.
func NewPersister(svc *Service, cfg QueueConfig, log *slog.Logger) *Persister {
	return &Persister{svc: svc, cfg: cfg, log: log.With("consumer", cfg.Consumer), claimCursor: "0-0"}
}

// Run consumes until ctx is done, then finishes the batch in hand and
// drains what this instance was given, until drain is done.
func (p *Persister) Run(ctx, drain context.Context) {
	if err := p.ensureGroup(drain); err != nil {
		p.log.Warn("create consumer group; retrying in the loop", "err", err)
	}
	// Entries delivered to this consumer before a restart come first.
	p.catchUp(drain)
	claim := time.NewTicker(p.cfg.ClaimIdle / 2)
	defer claim.Stop()
	trim := time.NewTicker(10 * time.Second)
	defer trim.Stop()
	for ctx.Err() == nil {
		select {
		case <-claim.C:
			p.claim(drain)
			p.catchUp(drain) // own entries whose write failed before
		case <-trim.C:
			p.trim(drain)
		default:
		}
		if _, err := p.readNew(drain, 200*time.Millisecond); err != nil {
			p.log.Warn("read stream", "err", err)
			sleep(ctx, time.Second)
		}
	}
	// Shutting down: the HTTP server has stopped accepting, so what is
	// left is finite. Write it, bounded by the drain deadline.
	for drain.Err() == nil {
		n, err := p.readNew(drain, 0)
		if err != nil || n == 0 {
			break
		}
	}
	p.catchUp(drain)
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// ensureGroup creates the group, and the stream with it, if missing:
// reading with a group that does not exist fails with NOGROUP. "0" makes
// a new group start at the oldest entry, so entries accepted before the
// group existed are not skipped.
func (p *Persister) ensureGroup(ctx context.Context) error {
	err := p.svc.rdb.XGroupCreateMkStream(ctx, streamKey, groupName, "0").Err()
	if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return fmt.Errorf("create group %s: %w", groupName, err)
	}
	return nil
}

// readNew reads entries never delivered to anyone, and writes them. block
// 0 means do not wait.
func (p *Persister) readNew(ctx context.Context, block time.Duration) (int, error) {
	args := &redis.XReadGroupArgs{
		Group: groupName, Consumer: p.cfg.Consumer,
		Streams: []string{streamKey, ">"}, Count: int64(p.cfg.Batch), Block: block,
	}
	if block == 0 {
		args.Block = -1 // go-redis: negative leaves BLOCK out; 0 would block forever
	}
	streams, err := p.svc.rdb.XReadGroup(ctx, args).Result()
	if errors.Is(err, redis.Nil) {
		return 0, nil // a blocking read that timed out
	}
	if err != nil {
		if strings.HasPrefix(err.Error(), "NOGROUP") {
			return 0, p.ensureGroup(ctx) // Redis lost the group (a flush)
		}
		return 0, err
	}
	n := 0
	for _, s := range streams {
		n += len(s.Messages)
		p.handle(ctx, s.Messages)
	}
	return n, nil
}

// catchUp rereads the entries delivered to this consumer and not yet
// acknowledged (ID "0" instead of ">"), and writes them.
func (p *Persister) catchUp(ctx context.Context) {
	from := "0"
	for ctx.Err() == nil {
		streams, err := p.svc.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
			Group: groupName, Consumer: p.cfg.Consumer,
			Streams: []string{streamKey, from}, Count: int64(p.cfg.Batch), Block: -1,
		}).Result()
		if err != nil || len(streams) == 0 || len(streams[0].Messages) == 0 {
			return
		}
		msgs := streams[0].Messages
		p.handle(ctx, msgs)
		from = msgs[len(msgs)-1].ID
	}
}

// claim takes over entries another consumer was given but has not
// acknowledged for ClaimIdle: that consumer's process has most likely
// died. XAUTOCLAIM walks the pending list with a cursor; carrying it from
// call to call makes each call continue where the last one stopped.
func (p *Persister) claim(ctx context.Context) {
	msgs, next, err := p.svc.rdb.XAutoClaim(ctx, &redis.XAutoClaimArgs{
		Stream: streamKey, Group: groupName, Consumer: p.cfg.Consumer,
		MinIdle: p.cfg.ClaimIdle, Start: p.claimCursor, Count: int64(p.cfg.Batch),
	}).Result()
	if err != nil {
		if !errors.Is(err, redis.Nil) {
			p.log.Warn("claim idle entries", "err", err)
		}
		return
	}
	p.claimCursor = next
	if len(msgs) > 0 {
		p.log.Info("claimed entries of an idle consumer", "count", len(msgs))
		p.handle(ctx, msgs)
	}
}

// handle writes a batch and acknowledges what was settled: written, found
// already written, or sent to the dead letters.
func (p *Persister) handle(ctx context.Context, msgs []redis.XMessage) {
	// A batch once read is finished even if shutdown begins meanwhile; its
	// writes are bounded instead (see write), and so is the whole batch:
	// well before another consumer may claim its entries, and so that a
	// MySQL that does not answer cannot hold shutdown hostage.
	ctx = context.WithoutCancel(ctx)
	deadline := time.Now().Add(p.cfg.ClaimIdle / 2)
	var entries []redis.XMessage
	var orders []Order
	for _, m := range msgs {
		o, err := parseEntry(m)
		if err != nil {
			p.deadLetter(ctx, m, err) // cannot ever succeed: do not retry
			continue
		}
		entries = append(entries, m)
		orders = append(orders, o)
	}
	if len(orders) == 0 {
		return
	}
	err := p.write(ctx, deadline, orders)
	if err == nil {
		p.ack(ctx, entries, orders)
		return
	}
	// The batch failed as a whole. Write its entries one by one, so that
	// one bad entry cannot hold the others back.
	p.log.Warn("batch failed; writing its entries one by one", "size", len(orders), "err", err)
	for i, o := range orders {
		if time.Now().After(deadline) {
			return // the rest stay pending for the next attempt
		}
		err := p.write(ctx, deadline, []Order{o})
		switch {
		case err == nil:
			p.ack(ctx, entries[i:i+1], orders[i:i+1])
		case errors.Is(err, ErrSoldOut) || errors.Is(err, ErrAlreadyOrdered) || errors.Is(err, errIDCollision):
			p.deadLetter(ctx, entries[i], err) // MySQL refuses it for good: retrying cannot help
		case refused(err) && p.deliveries(ctx, entries[i].ID) >= p.cfg.MaxDeliveries:
			p.deadLetter(ctx, entries[i], err) // MySQL answered, with the same error, again and again
		default:
			// MySQL unreachable, a timeout, a lock wait or a deadlock:
			// left pending, however long it takes. catchUp or another
			// consumer's claim tries again; an accepted order is never
			// given up because MySQL was away.
		}
	}
}

// write runs writeBatch in a transaction that must end by deadline.
func (p *Persister) write(ctx context.Context, deadline time.Time, orders []Order) error {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	return p.svc.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error { return writeBatch(tx, orders) })
}

// refused reports whether MySQL itself answered err (a statement it
// would not run), as opposed to not answering, timing out, or a lock wait
// or deadlock, which are worth retrying forever.
func refused(err error) bool {
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return false
	}
	switch me.Number {
	case 1205, 1213, 1040, 1203, 1317: // lock wait timeout, deadlock, too many connections, user connections, interrupted
		return false
	}
	return true
}

// errIDCollision is an entry whose order ID another order already has.
var errIDCollision = errors.New("order ID collision")

// errWrittenMeanwhile: the order was written by another writer while this
// one tried (a claim raced a slow consumer). The transaction rolls back;
// the next attempt finds the row and settles the entry.
var errWrittenMeanwhile = errors.New("order written meanwhile by another writer")

// writeBatch writes orders in one transaction: skip those already written
// (a redelivery), insert the rest in one multi-row INSERT, and take each
// voucher's units with one guarded UPDATE. ">= n" is "> 0" for n units: a
// batch that would take more than is left fails whole.
func writeBatch(tx *gorm.DB, orders []Order) error {
	ids := make([]int64, len(orders))
	for i, o := range orders {
		ids[i] = o.ID
	}
	var done []Order
	if err := tx.Raw("SELECT id, user_id, voucher_id FROM voucher_orders WHERE id IN ?", ids).Scan(&done).Error; err != nil {
		return fmt.Errorf("find written orders: %w", err)
	}
	written := map[int64]bool{}
	owner := map[int64]Order{}
	for _, d := range done {
		written[d.ID], owner[d.ID] = true, d
	}
	for _, o := range orders {
		// The same ID for another order is not a redelivery: Redis lost its
		// ID counters and handed out an ID already used.
		if d, ok := owner[o.ID]; ok && (d.UserID != o.UserID || d.VoucherID != o.VoucherID) {
			return fmt.Errorf("%w: order %d is already another order's ID", errIDCollision, o.ID)
		}
	}
	var fresh []Order
	units := map[int64]int64{}
	for _, o := range orders {
		if !written[o.ID] {
			written[o.ID] = true // the same entry twice in one batch
			fresh = append(fresh, o)
			units[o.VoucherID]++
		}
	}
	if len(fresh) == 0 {
		return nil
	}
	if err := tx.Create(&fresh).Error; err != nil {
		if errors.Is(err, gorm.ErrDuplicatedKey) && len(fresh) == 1 {
			// One order: tell which key it hit. The same order written
			// meanwhile by another writer is success; the user's other
			// order is a refusal.
			if err := duplicate(tx, &fresh[0]); err != nil {
				return err
			}
			return errWrittenMeanwhile
		}
		return fmt.Errorf("insert %d orders: %w", len(fresh), err)
	}
	// Voucher rows are locked in ID order, so that two batches touching the
	// same vouchers cannot each hold one the other waits for (a deadlock).
	for _, voucherID := range slices.Sorted(maps.Keys(units)) {
		n := units[voucherID]
		res := tx.Exec("UPDATE vouchers SET stock = stock - ? WHERE id = ? AND stock >= ?", n, voucherID, n)
		if res.Error != nil {
			return fmt.Errorf("deduct %d from voucher %d: %w", n, voucherID, res.Error)
		}
		if res.RowsAffected == 0 {
			return ErrSoldOut
		}
	}
	return nil
}

// ack acknowledges settled entries and forgets their pending markers, in
// one round trip.
func (p *Persister) ack(ctx context.Context, entries []redis.XMessage, orders []Order) {
	ids := make([]string, len(entries))
	for i, m := range entries {
		ids[i] = m.ID
	}
	fields := make([]string, len(orders))
	for i, o := range orders {
		fields[i] = strconv.FormatInt(o.ID, 10)
	}
	pipe := p.svc.rdb.Pipeline()
	pipe.XAck(ctx, streamKey, groupName, ids...)
	pipe.HDel(ctx, pendingKey, fields...)
	if _, err := pipe.Exec(ctx); err != nil {
		// Not acknowledged: the entries are delivered again and found
		// already written. Nothing is lost.
		p.log.Warn("acknowledge written entries", "count", len(ids), "err", err)
	}
}

// deadLetter moves an entry that cannot be written to the dead-letter
// stream, with its error, and acknowledges it so the rest flows on. Its
// order's status becomes "failed".
func (p *Persister) deadLetter(ctx context.Context, m redis.XMessage, cause error) {
	values := map[string]any{"stream_id": m.ID, "error": cause.Error()}
	for k, v := range m.Values {
		values[k] = v
	}
	pipe := p.svc.rdb.TxPipeline()
	pipe.XAdd(ctx, &redis.XAddArgs{Stream: deadKey, Values: values})
	pipe.XAck(ctx, streamKey, groupName, m.ID)
	if id, ok := m.Values["id"].(string); ok {
		if v, err := p.svc.rdb.HGet(ctx, pendingKey, id).Result(); err == nil {
			if i := strings.LastIndexByte(v, ':'); i > 0 {
				pipe.HSet(ctx, pendingKey, id, v[:i]+":"+StatusFailed)
			}
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		p.log.Warn("dead-letter entry", "id", m.ID, "err", err)
		return
	}
	p.log.Error("entry sent to the dead letters", "id", m.ID, "values", m.Values, "err", cause)
}

// deliveries is how often an entry has been delivered.
func (p *Persister) deliveries(ctx context.Context, id string) int64 {
	ps, err := p.svc.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{
		Stream: streamKey, Group: groupName, Start: id, End: id, Count: 1,
	}).Result()
	if err != nil || len(ps) == 0 {
		return 0
	}
	return ps[0].RetryCount
}

// trim drops entries every consumer has acknowledged: those older than
// the oldest pending entry, or than the last delivered one when none is
// pending. Never an entry that is not yet written.
func (p *Persister) trim(ctx context.Context) {
	groups, err := p.svc.rdb.XInfoGroups(ctx, streamKey).Result()
	if err != nil {
		return
	}
	var minID string
	for _, g := range groups {
		if g.Name != groupName {
			continue
		}
		minID = g.LastDeliveredID
		if g.Pending > 0 {
			sum, err := p.svc.rdb.XPending(ctx, streamKey, groupName).Result()
			if err != nil {
				return
			}
			minID = sum.Lower
		}
	}
	if minID == "" || minID == "0-0" {
		return
	}
	if err := p.svc.rdb.XTrimMinIDApprox(ctx, streamKey, minID, 0).Err(); err != nil {
		p.log.Warn("trim stream", "err", err)
	}
}

// parseEntry reads an order from a stream entry.
func parseEntry(m redis.XMessage) (Order, error) {
	num := func(name string) (int64, error) {
		s, _ := m.Values[name].(string)
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 {
			return 0, fmt.Errorf("entry %s: field %s = %q is not a positive integer", m.ID, name, s)
		}
		return n, nil
	}
	id, err1 := num("id")
	user, err2 := num("user")
	voucherID, err3 := num("voucher")
	at, err4 := num("at")
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return Order{}, err
	}
	return Order{ID: id, UserID: user, VoucherID: voucherID, Status: StatusCreated, CreatedAt: time.UnixMilli(at).UTC()}, nil
}

// QueueStats is what admins see of the queue.
type QueueStats struct {
	Length      int64         `json:"length"`  // entries in the stream (written ones until trimmed)
	Lag         int64         `json:"lag"`     // entries not yet delivered to any consumer
	Pending     int64         `json:"pending"` // delivered, not yet acknowledged
	Consumers   []string      `json:"consumers"`
	DeadLetters int64         `json:"dead_letters"`
	RecentDead  []DeadLetters `json:"recent_dead_letters"`
}

// DeadLetters is one dead-letter entry.
type DeadLetters struct {
	ID     string         `json:"id"`
	Values map[string]any `json:"values"`
}

// Stats reads the queue's state.
func (s *Service) QueueStats(ctx context.Context) (QueueStats, error) {
	var st QueueStats
	pipe := s.rdb.Pipeline()
	length := pipe.XLen(ctx, streamKey)
	dead := pipe.XLen(ctx, deadKey)
	recent := pipe.XRevRangeN(ctx, deadKey, "+", "-", 20)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return st, fmt.Errorf("queue stats: %w", err)
	}
	st.Length, st.DeadLetters = length.Val(), dead.Val()
	st.Consumers = []string{}
	st.RecentDead = []DeadLetters{}
	for _, m := range recent.Val() {
		st.RecentDead = append(st.RecentDead, DeadLetters{ID: m.ID, Values: m.Values})
	}
	groups, err := s.rdb.XInfoGroups(ctx, streamKey).Result()
	if err != nil && !strings.Contains(err.Error(), "no such key") {
		return st, fmt.Errorf("queue stats: %w", err)
	}
	for _, g := range groups {
		if g.Name == groupName {
			st.Lag, st.Pending = g.Lag, g.Pending
		}
	}
	if consumers, err := s.rdb.XInfoConsumers(ctx, streamKey, groupName).Result(); err == nil {
		for _, c := range consumers {
			st.Consumers = append(st.Consumers, c.Name)
		}
	}
	return st, nil
}
