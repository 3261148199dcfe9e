package queue

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/stock"
)

// Delivery: the consumer group that writes every accepted order to MySQL
// exactly once in effect, through a Writer.
//
// This file holds the consumer, its loop (Run) and its health (sick,
// recover). What it reads from the stream is in consumer_read.go, how it
// writes and acknowledges a batch in consumer_write.go.

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
		err = p.handle(drain, own, true)
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
