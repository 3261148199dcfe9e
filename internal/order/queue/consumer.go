package queue

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/stock"
)

// Delivery: the consumer group that writes every accepted order to MySQL
// exactly once in effect, through a Writer.

// Writer writes accepted orders to the database, and says what became of
// them. Package order's is the one the server runs; this package knows no
// SQL.
type Writer interface {
	// Write writes entries in one transaction. An entry written before (a
	// redelivery: the consumer died between the commit and the
	// acknowledgement) is found and not written again: it counts as
	// Written.
	Write(ctx context.Context, entries []Entry) (Verdict, error)
	// Probe makes a write that changes nothing: it succeeds once the
	// database takes writes again (a read-only server answers pings and
	// reads).
	Probe(ctx context.Context) error
}

// A Verdict is what a Write learned. Only the database's verdict on an
// entry itself is final; everything else is tried again for as long as it
// takes: an order that was answered 200 is never given up because the
// database was away.
type Verdict int

const (
	// Written: committed, or found written before.
	Written Verdict = iota
	// Later: nothing was learned about the entries: the database could
	// not be reached, did not answer, answered that it cannot write now
	// (read-only during a failover, disk full, too many connections, a
	// lock wait, a deadlock), or lost the answer to the COMMIT. Write them
	// again later, as they are.
	Later
	// Refused: the database refused a value of an entry (a batch's:
	// of one of them), such as a duplicate key or a CHECK. Written again
	// alone, an entry refused MaxDeliveries times is dead-lettered.
	Refused
	// NoStock: the database has no unit left for the entry (Redis counted
	// one too many). Dead-lettered at once, its unit not given back.
	NoStock
	// HasOrder: the entry's user holds another order of the voucher.
	// Dead-lettered at once, the user still a buyer.
	HasOrder
	// IDTaken: the entry's order ID is another order's. Dead-lettered at
	// once.
	IDTaken
)

var (
	//go:embed prune.lua
	pruneSrc    string
	pruneScript = redis.NewScript(pruneSrc)

	//go:embed ack.lua
	ackSrc    string
	ackScript = redis.NewScript(ackSrc)
)

// Config tunes the consumer that writes accepted orders to MySQL.
type Config struct {
	Consumer      string        // this consumer's name: stable across restarts of one instance
	Shard         int           // the shard whose stream it reads (stock.ShardOf); see NewConsumers
	Batch         int           // entries read and written at once
	ClaimIdle     time.Duration // an entry pending this long in another consumer is taken over
	MaxDeliveries int64         // deliveries after which a failing entry goes to the dead letters
	// OnBatch is told the size of every transaction that settled entries,
	// so that someone (package metrics) can count them; nil tells nobody.
	// It must be cheap and must not block.
	OnBatch func(n int)
}

// DefaultConfig is a good start.
var DefaultConfig = Config{Batch: 500, ClaimIdle: 5 * time.Second, MaxDeliveries: 5}

// Consumer is one consumer of the group that writes a shard's orders
// stream to MySQL. Each server instance runs one per shard (NewConsumers),
// named so that a restarted instance finds its own unacknowledged entries
// again.
//
// At-least-once: an entry is acknowledged only after its transaction
// commits, so a crash between the two redelivers it, and writing an entry
// twice is a no-op (the order ID is the primary key, checked first).
//
// A consumer that cannot write (MySQL down, read-only during a failover,
// out of disk) is sick: it stops taking new entries, so that the healthy
// consumers get them, and leaves its own entries alone, so that they go
// idle and the healthy consumers claim them. It probes MySQL with
// exponential back-off until a write succeeds. Nothing it was given is ever
// dead-lettered for being unwritable: only MySQL's verdict on an entry
// itself (a duplicate order, a value it rejects) makes a dead letter.
type Consumer struct {
	w   Writer
	rdb redis.UniversalClient
	now func() time.Time
	cfg Config
	log *slog.Logger

	// The shard's keys (p.stream and the rest).
	stream, dead, pending string

	claimCursor string // XAUTOCLAIM's cursor, carried from call to call
	size        int    // entries read at once: Batch, halved while batches run out of time

	// While sick: the back-off before the next probe, since when, and when
	// it was last logged (once a minute is enough to be seen).
	backoff   time.Duration
	sickSince time.Time
	sickLog   time.Time
	lastErr   error
}

// NewConsumer returns a Consumer of the orders stream of shard cfg.Shard
// in rdb that writes through w.
func NewConsumer(rdb redis.UniversalClient, w Writer, now func() time.Time, cfg Config, log *slog.Logger) *Consumer {
	if cfg.OnBatch == nil {
		cfg.OnBatch = func(int) {}
	}
	return &Consumer{w: w, rdb: rdb, now: now, cfg: cfg, log: log.With("consumer", cfg.Consumer, "shard", cfg.Shard),
		stream: StreamKey(cfg.Shard), dead: deadKey(cfg.Shard), pending: pendingKey(cfg.Shard),
		claimCursor: "0-0", size: cfg.Batch}
}

// NewConsumers returns a Consumer for every shard's stream (stock.Shards),
// all with cfg but for the shard: what one instance runs.
func NewConsumers(rdb redis.UniversalClient, w Writer, now func() time.Time, cfg Config, log *slog.Logger) []*Consumer {
	cs := make([]*Consumer, stock.Shards)
	for k := range cs {
		cfg.Shard = k
		cs[k] = NewConsumer(rdb, w, now, cfg, log)
	}
	return cs
}

// RunAll runs every consumer of cs as Run does, and returns when all have.
func RunAll(ctx, drain context.Context, cs []*Consumer) {
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Go(func() { c.Run(ctx, drain) })
	}
	wg.Wait()
}

// Run consumes until ctx is done, then finishes the batch in hand and
// drains what this instance was given, until drain is done.
func (p *Consumer) Run(ctx, drain context.Context) {
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
		if p.sick() {
			p.recover(ctx, drain)
			continue
		}
		select {
		case <-claim.C:
			p.claim(drain)
			p.catchUp(drain) // own entries whose write failed before
		case <-trim.C:
			p.trim(drain)
			p.trimDead(drain)
			p.pruneConsumers(drain)
		default:
		}
		if _, err := p.readNew(drain, 200*time.Millisecond); err != nil {
			p.log.Warn("read stream", "err", err)
			sleep(ctx, time.Second)
		}
	}
	// Shutting down: the HTTP server has stopped accepting, so what is
	// left is finite. Write it, bounded by the drain deadline.
	for drain.Err() == nil && !p.sick() {
		n, err := p.readNew(drain, 0)
		if err != nil || n == 0 {
			break
		}
	}
	if !p.sick() {
		p.catchUp(drain)
	}
}

// sick reports whether the last write failed for a reason that is not the
// entry's own (see Consumer).
func (p *Consumer) sick() bool { return p.backoff > 0 }

// fell records that a write failed with err, a transient error.
func (p *Consumer) fell(err error) {
	if p.backoff == 0 {
		p.sickSince, p.sickLog = p.now(), p.now()
		p.log.Warn("MySQL does not take writes; this consumer stops reading new entries and retries with back-off", "err", err)
	}
	p.lastErr = err
	p.backoff = min(max(2*p.backoff, 100*time.Millisecond), maxBackoff)
}

// maxBackoff caps the wait between probes of a MySQL that will not write.
const maxBackoff = 5 * time.Second

// recover waits out the back-off (with jitter, so that the consumers of
// every instance do not retry in step), then tries a real write: its own
// pending entries, read with XRANGE so that their idle time keeps growing
// and a healthy consumer may claim them meanwhile (rereading them through
// the group would reset it). Holding none, it probes with a write that
// changes nothing (a read-only MySQL answers pings and reads). It is
// healthy again only when a write succeeds: a probe that succeeds while
// the real writes still fail (a row lock held, say) would make it bounce
// between sick and healthy without ever backing off.
func (p *Consumer) recover(ctx, drain context.Context) {
	d := p.backoff/2 + rand.N(p.backoff/2+1)
	sleep(ctx, d)
	if p.now().Sub(p.sickLog) >= time.Minute {
		p.sickLog = p.now()
		p.log.Warn("MySQL still does not take writes; retrying", "since", p.sickSince.Format(time.RFC3339), "err", p.lastErr)
	}
	own, err := p.ownPending(drain)
	if err == nil && len(own) > 0 {
		err = p.handle(drain, own)
	} else if err == nil {
		pctx, cancel := context.WithTimeout(drain, p.cfg.ClaimIdle/2)
		err = p.w.Probe(pctx)
		cancel()
	}
	if err != nil {
		p.fell(err)
		return
	}
	p.log.Info("MySQL takes writes again", "after", p.now().Sub(p.sickSince).Round(time.Millisecond))
	p.backoff, p.lastErr = 0, nil
	p.catchUp(drain)
}

// ownPending reads up to size entries delivered to this consumer and not
// yet acknowledged, without delivering them again (XPENDING, then XRANGE).
func (p *Consumer) ownPending(ctx context.Context) ([]redis.XMessage, error) {
	ps, err := p.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{
		Stream: p.stream, Group: GroupName, Start: "-", End: "+", Count: int64(p.size), Consumer: p.cfg.Consumer,
	}).Result()
	if err != nil || len(ps) == 0 {
		return nil, err
	}
	pipe := p.rdb.Pipeline()
	reads := make([]*redis.XMessageSliceCmd, len(ps))
	for i, e := range ps {
		reads[i] = pipe.XRangeN(ctx, p.stream, e.ID, e.ID, 1)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	var msgs []redis.XMessage
	for _, r := range reads {
		msgs = append(msgs, r.Val()...) // none: trimmed after another consumer wrote it
	}
	return msgs, nil
}

// ensureGroup creates the group, and the stream with it, if missing:
// reading with a group that does not exist fails with NOGROUP. "0" makes
// a new group start at the oldest entry, so entries accepted before the
// group existed are not skipped.
func (p *Consumer) ensureGroup(ctx context.Context) error {
	err := p.rdb.XGroupCreateMkStream(ctx, p.stream, GroupName, "0").Err()
	if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return fmt.Errorf("create group %s: %w", GroupName, err)
	}
	return nil
}

// readNew reads entries never delivered to anyone, and writes them. block
// 0 means do not wait.
func (p *Consumer) readNew(ctx context.Context, block time.Duration) (int, error) {
	args := &redis.XReadGroupArgs{
		Group: GroupName, Consumer: p.cfg.Consumer,
		Streams: []string{p.stream, ">"}, Count: int64(p.size), Block: block,
	}
	if block == 0 {
		args.Block = -1 // go-redis: negative leaves BLOCK out; 0 would block forever
	}
	streams, err := p.rdb.XReadGroup(ctx, args).Result()
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
		if err := p.handle(ctx, s.Messages); err != nil {
			p.fell(err)
		}
	}
	return n, nil
}

// catchUp rereads the entries delivered to this consumer and not yet
// acknowledged (ID "0" instead of ">"), and writes them.
func (p *Consumer) catchUp(ctx context.Context) {
	from := "0"
	for ctx.Err() == nil {
		streams, err := p.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
			Group: GroupName, Consumer: p.cfg.Consumer,
			Streams: []string{p.stream, from}, Count: int64(p.size), Block: -1,
		}).Result()
		if err != nil || len(streams) == 0 || len(streams[0].Messages) == 0 {
			return
		}
		msgs := streams[0].Messages
		if err := p.handle(ctx, msgs); err != nil {
			p.fell(err)
			return // the rest wait: rereading them would keep them from being claimed
		}
		from = msgs[len(msgs)-1].ID
	}
}

// claim takes over entries another consumer was given but has not
// acknowledged for ClaimIdle: that consumer's process has most likely
// died. XAUTOCLAIM walks the pending list with a cursor; carrying it from
// call to call makes each call continue where the last one stopped.
func (p *Consumer) claim(ctx context.Context) {
	msgs, next, err := p.rdb.XAutoClaim(ctx, &redis.XAutoClaimArgs{
		Stream: p.stream, Group: GroupName, Consumer: p.cfg.Consumer,
		MinIdle: p.cfg.ClaimIdle, Start: p.claimCursor, Count: int64(p.size),
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
		if err := p.handle(ctx, msgs); err != nil {
			p.fell(err)
		}
	}
}

// handle writes a batch and acknowledges what was settled: written, found
// already written, or sent to the dead letters. An entry that could not be
// written for a reason that is not its own stays pending, and handle
// returns that reason: the caller's consumer is sick (see Consumer).
func (p *Consumer) handle(ctx context.Context, msgs []redis.XMessage) error {
	// A batch once read is finished even if shutdown begins meanwhile (ctx
	// is the drain's, which ends only when SHUTDOWN_GRACE runs out), and
	// it must end well before another consumer may claim its entries.
	ctx, cancel := context.WithTimeout(ctx, p.cfg.ClaimIdle/2)
	defer cancel()
	deadline, _ := ctx.Deadline()
	var msgsOK []redis.XMessage
	var entries []Entry
	for _, m := range msgs {
		e, err := p.parse(m)
		if err != nil {
			p.deadLetter(ctx, m, err, false, false) // cannot ever succeed: do not retry
			continue
		}
		msgsOK = append(msgsOK, m)
		entries = append(entries, e)
	}
	if len(entries) == 0 {
		return nil
	}
	verdict, err := p.w.Write(ctx, entries)
	if verdict == Written {
		p.cfg.OnBatch(len(entries))
		p.size = min(2*p.size, p.cfg.Batch)
		p.ack(ctx, msgsOK, entries)
		return nil
	}
	if errors.Is(err, context.DeadlineExceeded) && len(entries) > 1 {
		// Too big to write in its time: smaller batches next, or the
		// same batch would run out of time forever.
		p.size = max(len(entries)/2, 1)
	}
	if verdict == Later {
		// MySQL is away, read-only, full, or lost the COMMIT's answer
		// (the next attempt finds the rows if it committed). Writing the
		// entries one by one would fail the same way.
		return err
	}
	// MySQL refused the batch because of what is in it. Write its entries
	// one by one, so that one bad entry cannot hold the others back.
	p.log.Warn("batch refused; writing its entries one by one", "size", len(entries), "err", err)
	for i, e := range entries {
		if time.Now().After(deadline) {
			return nil // the rest stay pending for the next attempt
		}
		verdict, err := p.w.Write(ctx, []Entry{e})
		switch {
		case verdict == Written:
			p.cfg.OnBatch(1)
			p.ack(ctx, msgsOK[i:i+1], entries[i:i+1])
		case verdict == Later:
			return err
		case verdict == NoStock, verdict == HasOrder, verdict == IDTaken:
			// MySQL refuses it for good: retrying cannot help.
			p.deadLetter(ctx, msgsOK[i], err, verdict == NoStock, verdict == HasOrder)
		case p.deliveries(ctx, msgsOK[i].ID) >= p.cfg.MaxDeliveries:
			p.deadLetter(ctx, msgsOK[i], err, false, false) // MySQL refused this entry, again and again
		}
		// Otherwise left pending: catchUp delivers it again, and counts.
	}
	return nil
}

// ack acknowledges written entries, forgets their pending markers, and
// counts them off their vouchers' queues (ack.lua), in one round trip.
func (p *Consumer) ack(ctx context.Context, msgs []redis.XMessage, entries []Entry) {
	keys := []string{p.stream, p.pending}
	args := []any{GroupName}
	for i, m := range msgs {
		keys = append(keys, entries[i].queuedKey())
		args = append(args, m.ID, entries[i].OrderID)
	}
	if err := ackScript.Run(ctx, p.rdb, keys, args...).Err(); err != nil {
		// Not acknowledged: the entries are delivered again and found
		// already written. Nothing is lost.
		p.log.Warn("acknowledge written entries", "count", len(msgs), "err", err)
	}
}

// deliveries is how often an entry has been delivered.
func (p *Consumer) deliveries(ctx context.Context, id string) int64 {
	ps, err := p.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{
		Stream: p.stream, Group: GroupName, Start: id, End: id, Count: 1,
	}).Result()
	if err != nil || len(ps) == 0 {
		return 0
	}
	return ps[0].RetryCount
}

// trim drops entries every consumer has acknowledged: those older than
// the oldest pending entry, or than the last delivered one when none is
// pending. Never an entry that is not yet written.
func (p *Consumer) trim(ctx context.Context) {
	groups, err := p.rdb.XInfoGroups(ctx, p.stream).Result()
	if err != nil {
		return
	}
	var minID string
	for _, g := range groups {
		if g.Name != GroupName {
			continue
		}
		minID = g.LastDeliveredID
		if g.Pending > 0 {
			sum, err := p.rdb.XPending(ctx, p.stream, GroupName).Result()
			if err != nil {
				return
			}
			minID = sum.Lower
		}
	}
	if minID == "" || minID == "0-0" {
		return
	}
	if err := p.rdb.XTrimMinIDApprox(ctx, p.stream, minID, 0).Err(); err != nil {
		p.log.Warn("trim stream", "err", err)
	}
}

// pruneConsumers removes from the group the consumers that hold no entry
// and have not read for a long time: instances that are gone (a name is
// host:port, and containers get new hosts). A live consumer reads every
// 200 ms; one that is sick (not reading) and holds nothing loses nothing by
// being removed: its next read adds it again.
func (p *Consumer) pruneConsumers(ctx context.Context) {
	consumers, err := p.rdb.XInfoConsumers(ctx, p.stream, GroupName).Result()
	if err != nil {
		return
	}
	idle := max(time.Hour, 100*p.cfg.ClaimIdle)
	for _, c := range consumers {
		if c.Name != p.cfg.Consumer && c.Pending == 0 && c.Idle > idle {
			if n, err := pruneScript.Run(ctx, p.rdb, []string{p.stream}, GroupName, c.Name).Int(); err == nil && n == 1 {
				p.log.Info("removed a consumer gone for long", "gone", c.Name, "idle", c.Idle)
			}
		}
	}
}

// parse reads an entry of this consumer's stream. An entry whose voucher
// (or bucket) belongs to another shard (not written by accept.lua, which
// queues in the shard of the unit's own keys) is malformed too: the
// scripts that settle it would touch keys of two cluster slots, which
// Redis Cluster refuses (CROSSSLOT) however often they are tried.
func (p *Consumer) parse(m redis.XMessage) (Entry, error) {
	e, err := parseEntry(m)
	if err == nil && e.shard() != p.cfg.Shard {
		return Entry{}, fmt.Errorf("entry %s: voucher %d (bucket %d of %d) is of shard %d, not of this stream's %d", m.ID, e.VoucherID, e.Bucket, e.Buckets, e.shard(), p.cfg.Shard)
	}
	return e, err
}
