package order

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"seckill/internal/stock"
)

// Group commit for sync mode.
//
// One transaction per order is what a hot voucher row allows: every order
// takes the row lock, and the next waits for the COMMIT (an fsync) of the
// one before. Requests that arrive together are therefore written together:
// each hands its order to the writer and waits; the writer takes whatever
// orders are waiting and commits them in one transaction (writeNew: one
// multi-row INSERT and one guarded UPDATE per voucher, as async mode's
// writeBatch, without its way back for a redelivery). The row is locked
// once per batch instead of once per order. Each request still answers
// only after its own row is committed, so a sync 200 keeps its promise.
// Under light load a batch is one order, and nothing waits for company:
// there is no timer.
//
// If a batch fails as a whole (one order's user already has one, say, or
// MySQL refuses one order's row: a value too long for its column), its
// orders are written again one by one, each by its own request, so that
// each gets its own answer (a refused row's is 500, the others' 200) and
// the writer goes on meanwhile. A batch that
// loses a conflict (error 1213: on a Galera cluster, another node wrote
// the voucher's row first) is not broken up: it is run again, whole,
// after a short pause (retryConflicts).
//
// Once a batch is committed its holds are closed together as well
// (closeHolds): one script per Redis shard they live in
// (stock.ConfirmAll), not one or two a request, in a goroutine of the
// batch's own so that the writer goes on with the next batch meanwhile.

// write is one request's order, waiting for the writer.
type write struct {
	ctx   context.Context // the user's lock's context: if it ends, the order must not be written
	order *Order
	hold  stock.Hold // the unit the order was taken with, closed once it is written
	done  chan written
}

// written is what the writer answers a request: its order's Outcome, and
// the error when it was not Written.
type written struct {
	outcome Outcome
	err     error
	alone   bool // not written: the batch failed, write it alone
	// closed: written, and the writer has closed the order's hold (or
	// tried: a failure leaves it to the Sweeper), so the request need not;
	// committed is when the COMMIT answered, before the holds were closed.
	closed    bool
	committed time.Time
}

// groupCommit is the group-commit loops' input, and what they write with.
type groupCommit struct {
	in  chan *write
	max int // orders in one transaction at most (Config.GroupCommit)
	db  *gorm.DB
	obs Observer
	// stocks closes the holds of the orders written (closeHolds); nil
	// leaves them to the requests.
	stocks *stock.Store
	// confirmWithin bounds closing a batch's holds (Config.WriteTimeout;
	// 0, in tests only: the Redis client's own timeouts).
	confirmWithin time.Duration
	log           *slog.Logger
}

func newGroupCommit(db *gorm.DB, obs Observer, most int, stocks *stock.Store, confirmWithin time.Duration, log *slog.Logger) *groupCommit {
	return &groupCommit{in: make(chan *write), max: max(most, 1), db: db, obs: obs, stocks: stocks, confirmWithin: confirmWithin, log: log}
}

// DefaultWriters is how many batches may be in flight at once by default
// (GROUP_COMMIT_WRITERS). One: a hot voucher's row lets one batch at a
// time take its units anyway, and while that batch commits the next
// gathers in the channel. More writers split the orders waiting into
// smaller batches, each a transaction and an fsync for MySQL: on one
// 2-core machine with MySQL beside the server, 1 writer sold about 6% more
// than 2 and 20% more than 4 (BENCHMARKS.md, issue 13's section). With
// MySQL across a network, a second writer can send its batch while the
// first waits for its COMMIT: worth measuring there.
const DefaultWriters = 1

// commit writes o, taken with h, through the writer and returns when it
// is committed or has failed, or when its COMMIT's answer was lost
// (Unknown). It waits for the answer even if ctx ends meanwhile: a batch
// already sent may commit the order, and the caller must know. The
// answer's closed says that the writer closed h (closeHolds); if not, the
// caller closes it once its order is Written.
func (g *groupCommit) commit(ctx context.Context, o *Order, h stock.Hold) written {
	w := &write{ctx: ctx, order: o, hold: h, done: make(chan written, 1)}
	select {
	case g.in <- w:
	case <-ctx.Done():
		return written{outcome: NotWritten, err: ctx.Err()}
	}
	r := <-w.done
	if r.alone {
		r = g.writeAlone(w)
	}
	return r
}

// RunWriter runs one group-commit loop until ctx is done; start
// GROUP_COMMIT_WRITERS of them in sync mode, and stop them only after the
// last request finished.
func (s *Service) RunWriter(ctx context.Context) { s.commits.run(ctx) }

func (g *groupCommit) run(ctx context.Context) {
	for {
		var first *write
		select {
		case first = <-g.in:
		case <-ctx.Done():
			return
		}
		batch := []*write{first}
	gather:
		for len(batch) < g.max {
			select {
			case w := <-g.in:
				batch = append(batch, w)
			default:
				break gather
			}
		}
		g.writeGroup(batch)
	}
}

func (g *groupCommit) writeGroup(batch []*write) {
	// A request whose lock is already lost (or whose time ran out) is not
	// written: its order would no longer be protected by the lock.
	live := batch[:0]
	for _, w := range batch {
		if err := w.ctx.Err(); err != nil {
			w.done <- written{outcome: NotWritten, err: err}
			continue
		}
		live = append(live, w)
	}
	if len(live) == 0 {
		return
	}
	if len(live) > 1 {
		orders := make([]Order, len(live))
		for i, w := range live {
			orders[i] = *w.order
		}
		// The batch runs under every member's context at once: if any
		// member's lock is lost or its time runs out, the batch rolls back,
		// and the others are written one by one below.
		//
		// Its statements are traced (package tracing) as part of the first
		// member's request: one transaction cannot belong to several.
		ctx, cancel := context.WithCancel(trace.ContextWithSpanContext(context.Background(), trace.SpanContextFromContext(live[0].ctx)))
		watches := make([]func() bool, len(live))
		for i, w := range live {
			watches[i] = context.AfterFunc(w.ctx, cancel) // cancel the batch when w's context ends
		}
		// A conflict (another node wrote the voucher's row first) rolls
		// the batch back whole: it is run again whole, as a batch. Broken
		// up into its orders, each would meet the same conflict alone.
		outcome, err := transactRetried(ctx, g.db, g.obs, nil, func(tx *gorm.DB) error { return writeNew(tx, orders) })
		cancel()
		for _, stop := range watches {
			stop()
		}
		switch outcome {
		case Written:
			g.obs.Committed(len(live))
			g.closeHolds(live)
			return
		case Unknown:
			// The batch's COMMIT went unanswered: every member looks its
			// own order up (resolve), in its own request.
			for _, w := range live {
				w.done <- written{outcome: Unknown, err: err}
			}
			return
		}
	}
	if len(live) == 1 {
		w := live[0]
		if r := g.writeAlone(w); r.outcome != Written {
			w.done <- r
			return
		}
		g.closeHolds(live)
		return
	}
	// The batch failed as a whole: each member writes its order alone, in
	// its own request, while the writer goes on with the next batch. Done
	// here, a bad order would hold every other order of the instance, of
	// every voucher, behind up to a batch's worth of transactions.
	for _, w := range live {
		w.done <- written{alone: true}
	}
}

// writeAlone writes w's order in a transaction of its own, run again
// when it loses a conflict.
func (g *groupCommit) writeAlone(w *write) written {
	outcome, err := transactRetried(w.ctx, g.db, g.obs, nil, func(tx *gorm.DB) error { return insert(tx, w.order) })
	if outcome == Written {
		g.obs.Committed(1)
	}
	return written{outcome: outcome, err: err}
}

// closeHolds closes the holds of ws, whose orders are committed, with one
// script per Redis shard they live in (stock.ConfirmAll), then answers each
// request Written. It does so in a goroutine of its own: the writer goes on
// with the next batch while Redis answers.
//
// The requests wait for their holds to close before they answer 200, as
// they did when each closed its own: the wait is one round trip to Redis,
// the same as before, and costs no CPU, while a 200 sent sooner would
// promise less. The answer would then come before the hold is closed, and
// for that moment the buyer's next press on another instance would meet
// the open hold and be told 429 busy rather than 409 already_ordered
// (docs/api.md), and a waiting room would still show them holding an
// admission. CPU is what sets a sync order's rate on a busy machine
// (BENCHMARKS.md), and the saving is in the scripts, not in the wait.
//
// If Redis fails meanwhile (down, the reply lost, confirmWithin spent),
// the orders are committed all the same, and the requests answer 200: the
// holds stay open until they expire, and the Sweeper, seeing each order's
// row in MySQL, closes them then, keeping the buyers (Store.Settle), as
// it did when a request's own Confirm failed. A hold is never given back
// for an order that exists, since the Sweeper asks MySQL first.
func (g *groupCommit) closeHolds(ws []*write) {
	if g.stocks == nil {
		for _, w := range ws {
			w.done <- written{outcome: Written}
		}
		return
	}
	committed := time.Now()
	hs := make([]stock.Hold, len(ws))
	for i, w := range ws {
		hs[i] = w.hold
	}
	// Traced, as the batch's transaction, with the first member's request.
	span := trace.SpanContextFromContext(ws[0].ctx)
	go func() {
		// Every request of the batch is answered, whatever happens here:
		// each waits for its written without a deadline (commit). A panic
		// (a bug in the Redis client's code) is logged, not left to end
		// the process from this goroutine, where no web.Recover is; the
		// holds are then the Sweeper's, as after a failed close.
		left := len(hs) // open, until ConfirmAll says otherwise
		defer func() {
			if r := recover(); r != nil {
				g.log.Error("confirm the holds of a group commit panicked; the sweeper will", "orders", len(hs), "panic", r)
			}
			if left > 0 {
				g.obs.Unconfirmed(left)
			}
			for _, w := range ws {
				w.done <- written{outcome: Written, closed: true, committed: committed}
			}
		}()
		ctx := trace.ContextWithSpanContext(context.Background(), span)
		if g.confirmWithin > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, g.confirmWithin)
			defer cancel()
		}
		_, err := g.stocks.ConfirmAll(ctx, hs)
		left = 0
		if err != nil {
			// The holds of the calls that failed (some shards' may be
			// closed); all of them if the error does not say.
			left = len(hs)
			if ue, ok := errors.AsType[*stock.UnconfirmedError](err); ok {
				left = ue.Holds
			}
		}
		g.obs.Stage(StageConfirm, time.Since(committed))
		if err != nil {
			g.log.WarnContext(ctx, "confirm the holds of a group commit; the sweeper will", "orders", len(hs), "open", left, "err", err)
		}
	}()
}
