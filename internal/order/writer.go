package order

import (
	"context"

	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"
)

// Group commit for sync mode.
//
// One transaction per order is what a hot voucher row allows: every order
// takes the row lock, and the next waits for the COMMIT (an fsync) of the
// one before. Requests that arrive together are therefore written together:
// each hands its order to the writer and waits; the writer takes whatever
// orders are waiting and commits them in one transaction (writeNew: one
// multi-row INSERT and one guarded UPDATE per voucher, as async mode's
// writeBatch, without its look for orders written before). The row is
// locked once per batch instead of once per order. Each request still answers only after its own row is
// committed, so a sync 200 keeps its promise. Under light load a batch is
// one order, and nothing waits for company: there is no timer.
//
// If a batch fails as a whole (one order's user already has one, say, or
// MySQL refuses one order's row: a value too long for its column), its
// orders are written again one by one, each by its own request, so that
// each gets its own answer (a refused row's is 500, the others' 200) and
// the writer goes on meanwhile. A batch that
// loses a conflict (error 1213: on a Galera cluster, another node wrote
// the voucher's row first) is not broken up: it is run again, whole,
// after a short pause (retryConflicts).

// write is one request's order, waiting for the writer.
type write struct {
	ctx   context.Context // the user's lock's context: if it ends, the order must not be written
	order *Order
	done  chan written
}

// written is what the writer answers a request: its order's Outcome, and
// the error when it was not Written.
type written struct {
	outcome Outcome
	err     error
	alone   bool // not written: the batch failed, write it alone
}

// groupCommit is the group-commit loops' input, and what they write with.
type groupCommit struct {
	in  chan *write
	max int // orders in one transaction at most (Config.GroupCommit)
	db  *gorm.DB
	obs Observer
}

func newGroupCommit(db *gorm.DB, obs Observer, most int) *groupCommit {
	return &groupCommit{in: make(chan *write), max: max(most, 1), db: db, obs: obs}
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

// commit writes o through the writer and returns when it is committed or
// has failed, or when its COMMIT's answer was lost (Unknown). It waits for
// the answer even if ctx ends meanwhile: a batch already sent may commit
// the order, and the caller must know.
func (g *groupCommit) commit(ctx context.Context, o *Order) (Outcome, error) {
	w := &write{ctx: ctx, order: o, done: make(chan written, 1)}
	select {
	case g.in <- w:
	case <-ctx.Done():
		return NotWritten, ctx.Err()
	}
	r := <-w.done
	if r.alone {
		r = g.writeAlone(w)
	}
	return r.outcome, r.err
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
			for _, w := range live {
				w.done <- written{outcome: Written}
			}
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
		w.done <- g.writeAlone(w)
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
