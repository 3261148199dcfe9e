package order

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	"gorm.io/gorm"

	"seckill/internal/apperr"
	"seckill/internal/idworker"
	"seckill/internal/lock"
	"seckill/internal/order/queue"
	"seckill/internal/payment"
	"seckill/internal/stock"
	"seckill/internal/voucher"
)

// Config tunes the seckill path. DefaultConfig is a good start.
type Config struct {
	// WriteTimeout bounds everything between taking a unit in Redis and
	// committing the order: the lock and the transaction; and, apart, the
	// close of a group commit's holds after it. It must be well
	// under the stock hold (see stock.NewStore), or the Sweeper could
	// return a unit whose order is still being written.
	WriteTimeout time.Duration
	// LockTTL is how long the per-user lock lives if its holder dies
	// without releasing it. The watchdog renews it while the order is
	// written, so it need not cover a slow transaction.
	LockTTL time.Duration
	// SoldOutMemo is how long an instance remembers that a voucher is
	// sold out and answers sold_out without asking Redis: the cheapest
	// answer to the flood that follows a sale. It is remembered only when
	// no request held a unit that could come back, so what reopens a sale
	// is rare (a reconciliation after Redis lost data, a cancelled order's
	// unit, which then waits this long for this instance's buyers); 0
	// turns it off.
	SoldOutMemo time.Duration
	// Async accepts orders in Redis and leaves writing them to a
	// consumer (async.go, package order/queue); otherwise the row is
	// written in the request.
	Async bool
	// GroupCommit is the most orders of concurrent requests written in one
	// transaction in sync mode (writer.go); 1 writes each on its own.
	GroupCommit int
	// Observer is told the stages' timings and what the lock, the group
	// commit and the sweeper did (observe.go); nil tells nobody.
	Observer Observer
	// Provider is the payment provider: it charges buyers (Pay) and gives
	// refunds (Refund). Nil: no payments are taken here (Pay answers
	// unavailable), though the webhook still applies the provider's
	// events.
	Provider payment.Provider
	// Truth is where the reads go that decide what becomes of a unit:
	// whether an order whose COMMIT answer was lost exists, whether an
	// expired hold's order does, the stock a reload or a reconciliation
	// puts in Redis. On a Galera cluster it is a pool whose reads wait
	// until their node has applied every commit the cluster certified
	// before them (wsrep_sync_wait): a node reads a moment behind the
	// others, and a read that missed another node's last commit would
	// give a unit back that was sold, or sell one twice. Nil: the
	// service's db, which on one server is the truth already.
	Truth *gorm.DB
}

// DefaultConfig suits a stock hold of 15s.
var DefaultConfig = Config{WriteTimeout: 5 * time.Second, LockTTL: 10 * time.Second, SoldOutMemo: 100 * time.Millisecond, GroupCommit: 100}

// Service sells vouchers. It is safe for concurrent use.
type Service struct {
	common
	vouchers *voucher.Service
	stocks   *stock.Store
	locks    lock.Locker
	ids      *idworker.Worker

	mode    mode         // sync or async: how a unit becomes an order
	commits *groupCommit // sync mode's writer loops' input (writer.go)

	flights singleflight.Group // seed and reload: one attempt per instance at a time (restore.go)
	// The flights' lifetime: Close cancels them and waits for them, so
	// that none outlives the service and meets closed clients, leaving
	// its lock to expire on its own.
	flightsDone context.Context
	endFlights  context.CancelFunc
	flyMu       sync.Mutex
	flying      sync.WaitGroup
	closed      bool
}

// common is what the service and both modes use.
type common struct {
	db     *gorm.DB
	truth  *gorm.DB       // cfg.Truth, or db: the reads that decide a unit's fate
	pool   *idworker.Pool // order IDs, drawn a block at a time
	memory *memory        // what this instance knows for sure of buyers and sold-out vouchers
	obs    Observer       // cfg.Observer, or nobody
	now    func() time.Time
	log    *slog.Logger
	cfg    Config
}

// mode is the one thing sync and async mode do differently: how a unit of
// stock becomes an order once the sale window is checked. Sync mode
// (syncMode, below) writes the row before it answers; async mode
// (asyncMode, async.go) queues the order in Redis for a consumer to write.
// Everything else (the window, the memories, reloading Redis, the sweeper)
// is theirs in common, and asks the mode where the two differ. Each mode
// holds what it uses, and never calls back into the Service.
type mode interface {
	// place takes a unit of v for userID, makes it an order (or gives it
	// back), and returns the order's ID; errStockMissing if Redis lost
	// the voucher's stock keys, which the caller puts back first.
	place(ctx context.Context, v *voucher.Voucher, userID int64) (int64, error)
	// accepted returns an order taken but not yet a row, or nil.
	accepted(ctx context.Context, id int64) (*Order, error)
	// stockAt reads, as of one moment, the units of voucherID (of
	// buckets) left, its buyers and the units MySQL took back that Redis
	// has not, counting the orders on their way to MySQL: what a reload
	// puts back in Redis after Redis lost it.
	stockAt(ctx context.Context, voucherID int64, buckets int) (snapshot, error)
	// quiet reports whether no order of voucherID (of buckets) is on its
	// way to MySQL, so that Redis' count may be compared with MySQL's.
	quiet(ctx context.Context, voucherID int64, buckets int) (bool, error)
	// queuedOf returns the orders of voucherID (of buckets) that users
	// hold on their way to MySQL, by user (absent: none): what the
	// sweeper counts as orders besides MySQL's rows.
	queuedOf(ctx context.Context, voucherID int64, buckets int, users []int64) (map[int64]int64, error)
}

// errStockMissing: a stock script found the voucher's keys missing (Redis
// was flushed or restarted).
var errStockMissing = errors.New("stock keys missing")

// NewService returns a Service. q is async mode's queue (sync mode does
// not use it: nil will do).
func NewService(db *gorm.DB, q *queue.Queue, vouchers *voucher.Service, stocks *stock.Store, locks lock.Locker, ids *idworker.Worker, now func() time.Time, log *slog.Logger, cfg Config) *Service {
	s := &Service{vouchers: vouchers, stocks: stocks, locks: locks, ids: ids}
	obs := cfg.Observer
	if obs == nil {
		obs = nobody{}
	}
	truth := cfg.Truth
	if truth == nil {
		truth = db
	}
	s.common = common{db: db, truth: truth, memory: newMemory(now, cfg.SoldOutMemo), obs: obs, now: now, log: log, cfg: cfg}
	s.pool = ids.NewPool(orderIDPrefix, s.seed)
	s.commits = newGroupCommit(db, obs, cfg.GroupCommit, stocks, cfg.WriteTimeout, log)
	if cfg.Async {
		s.mode = asyncMode{common: s.common, queue: q, stocks: stocks}
	} else {
		s.mode = syncMode{common: s.common, stocks: stocks, locks: locks, ids: ids, commits: s.commits}
	}
	s.flightsDone, s.endFlights = context.WithCancel(context.Background())
	return s
}

// Seckill takes one unit of voucherID for userID and returns the new
// order's ID. In sync mode the order row is committed before it returns; in
// async mode the order is in Redis, on its way to MySQL.
func (s *Service) Seckill(ctx context.Context, userID, voucherID int64) (int64, error) {
	// Guard 1: the voucher exists and its sale is open. From memory.
	// (The guards are numbered as in the package doc, README.md and
	// docs/buy-path.md; the token and the throttle came before them, as
	// middleware.)
	v, err := s.vouchers.Find(ctx, voucherID)
	if err != nil {
		return 0, err
	}
	// One read of the clock for the checks from memory: the flood after
	// a sale ends at one of them, and each read costs as much as a map
	// look-up.
	now := s.now()
	if err := v.Open(now); err != nil {
		return 0, err
	}
	// A room's voucher is never remembered sold out: its buyers are
	// admitted only while a unit is free, and an admitted buyer is never
	// told sold_out.
	if !v.HasRoom() && s.memory.knownSoldOut(voucherID, now) {
		return 0, ErrSoldOut
	}
	if s.memory.knownBuyer(voucherID, userID, now) {
		return 0, ErrAlreadyOrdered
	}
	for attempt := 0; ; attempt++ {
		id, err := s.mode.place(ctx, v, userID)
		if !errors.Is(err, errStockMissing) {
			return id, err
		}
		// Redis was flushed or restarted: put the voucher's keys back
		// from MySQL (restore.go), then try again.
		if err := s.restore(ctx, voucherID, v.Parts(), attempt); err != nil {
			return 0, err
		}
	}
}

// syncMode writes the order row before the request answers: a 200 is a
// committed row.
type syncMode struct {
	common
	stocks  *stock.Store
	locks   lock.Locker
	ids     *idworker.Worker // a fresh ID when one was already used (write)
	commits *groupCommit
}

// place is sync mode's way from a unit of stock to an order row.
func (m syncMode) place(ctx context.Context, v *voucher.Voucher, userID int64) (int64, error) {
	voucherID := v.ID
	// Guard 2: take a unit in Redis, atomically with the stock and
	// one-per-user checks. Most requests of a flash sale end here.
	h, id, err := m.take(ctx, v, userID)
	if err != nil {
		return 0, err
	}

	// From here on this request holds a unit. Every way out either turns
	// it into an order row or gives it back, or, when nobody can tell which
	// (MySQL stopped answering right after a COMMIT), leaves it under its
	// hold for the Sweeper, which asks MySQL again later.
	id, outcome, closed, err := m.write(ctx, v, userID, id, h)
	switch outcome {
	case NotWritten:
		m.settleFailure(ctx, h, err)
		switch {
		case errors.Is(err, ErrAlreadyOrdered) || errors.Is(err, ErrSoldOut) || errors.Is(err, ErrBusy):
			return 0, err
		case permanent(err):
			// MySQL refused the row itself (a value it cannot store, a
			// CHECK): the same order would be refused again, so "try
			// again" (503) would be untrue. The schema and the code
			// disagree, which an operator must fix: 500, logged with its
			// cause by the web layer. Nothing was taken (settleFailure).
			return 0, fmt.Errorf("%w: %w", errRefused, err)
		}
		return 0, apperr.Down(err)
	case Unknown:
		m.log.WarnContext(ctx, "order outcome unknown: MySQL did not answer its COMMIT; the sweeper settles the hold",
			"voucher", voucherID, "user", userID, "order", id, "err", err)
		return 0, apperr.Down(fmt.Errorf("order %d: outcome unknown: %w", id, err))
	}

	// Close the hold, unless the group-commit writer closed it with the
	// rest of its batch (writer.go: closeHolds). The order is committed
	// whatever happens here: if Redis fails now, the Sweeper finds the
	// expired hold, sees the row, and closes it then.
	if !closed {
		start := time.Now()
		_, err := m.stocks.Confirm(context.WithoutCancel(ctx), h)
		m.obs.Stage(StageConfirm, time.Since(start))
		if err != nil {
			m.obs.Unconfirmed(1)
			m.log.WarnContext(ctx, "confirm hold; the sweeper will", "voucher", voucherID, "user", userID, "err", err)
		}
	}
	m.memory.rememberBuyer(voucherID, userID, true)
	return id, nil
}

// take runs the stock script, then draws the order's ID: only for the
// requests that took a unit, so the rejected majority never touches the ID
// pool.
func (m syncMode) take(ctx context.Context, v *voucher.Voucher, userID int64) (stock.Hold, int64, error) {
	voucherID := v.ID
	// Timed with the real clock, not m.now: a latency is not a date.
	start := time.Now()
	var h stock.Hold
	var res stock.Result
	var err error
	if v.HasRoom() {
		h, res, err = m.stocks.TakeAdmitted(ctx, voucherID, userID)
	} else {
		h, res, err = m.stocks.Take(ctx, voucherID, v.Parts(), userID)
	}
	m.obs.Stage(StageStock, time.Since(start))
	if err != nil {
		// Nothing taken; or, if only the reply was lost, a unit under
		// a hold that the sweeper gives back.
		return h, 0, apperr.Down(err)
	}
	switch res {
	case stock.Taken:
		// Bounded like the write that follows: a unit is held now, and
		// drawing its ID (seeding a lost sequence, at worst) plus the
		// write must end well within the hold (two thirds of it).
		ictx, cancel := context.WithTimeout(ctx, m.cfg.WriteTimeout)
		id, err := m.pool.Next(ictx)
		cancel()
		if err != nil {
			m.settleFailure(ctx, h, err)
			return h, 0, idError(err, m.now())
		}
		return h, id, nil
	case stock.SoldOut:
		m.memory.rememberSoldOut(voucherID)
		return h, 0, ErrSoldOut
	case stock.SoldOutForNow:
		return h, 0, ErrSoldOut
	case stock.AlreadyBought:
		m.memory.rememberBuyer(voucherID, userID, true)
		return h, 0, ErrAlreadyOrdered
	case stock.AlreadyBuying:
		return h, 0, busyRetry() // the other request may yet fail: try again
	case stock.Missing:
		return h, 0, errStockMissing
	case stock.NotAdmitted:
		return h, 0, ErrNotAdmitted
	}
	return h, 0, fmt.Errorf("take stock: unknown answer %d from the script", res)
}

// errRefused marks an order MySQL refused for what is in its row (see
// permanent): answered 500, since trying again cannot help.
var errRefused = errors.New("order refused by MySQL")

// busyRetry is ErrBusy with a Retry-After of a second: the other request
// of the user that holds the unit or the lock is done within milliseconds
// when all is well, and the lock lasts at most its TTL when it is not.
func busyRetry() error { return apperr.RetryAfter(ErrBusy, time.Second) }

// write writes the order of the unit h took under the user's lock, within
// WriteTimeout, and returns its ID (id, or a new one if id was already
// used: see errIDTaken), what became of it, and whether the writer closed
// h already (closeHolds).
func (m syncMode) write(ctx context.Context, v *voucher.Voucher, userID, id int64, h stock.Hold) (int64, Outcome, bool, error) {
	voucherID := v.ID
	wctx, cancel := context.WithTimeout(ctx, m.cfg.WriteTimeout)
	defer cancel()

	// Guard 3: the per-user lock. Taken after the stock script so that the
	// rejected majority never pays for it. Try once: a second request of
	// the same user is told to come back, not queued.
	start := time.Now()
	lk, err := m.locks.Obtain(wctx, UserLockKey(voucherID, userID), m.cfg.LockTTL, lock.WithWatchdog(m.cfg.WriteTimeout))
	m.obs.Stage(StageLock, time.Since(start))
	if errors.Is(err, lock.ErrNotAcquired) {
		m.obs.UserLock(LockContended)
		return 0, NotWritten, false, busyRetry()
	}
	if err != nil {
		return 0, NotWritten, false, err
	}
	m.obs.UserLock(LockObtained)
	defer func() {
		err := lk.Release(context.WithoutCancel(wctx))
		if errors.Is(err, lock.ErrNotHeld) {
			// Released only here, so not held means lost on the way.
			m.obs.UserLock(LockLost)
		} else if err != nil {
			m.log.WarnContext(wctx, "release user lock; it expires by itself", "key", lk.Key(), "err", err)
		}
	}()

	// Guard 4: MySQL, in one transaction with the orders of the requests
	// that arrived together (writer.go). It runs under the lock's context:
	// if the watchdog finds the lock lost, the order is not written, or its
	// transaction rolls back, instead of committing unprotected.
	for {
		o := newOrder(v, id, userID, m.now(), h.From)
		start := time.Now()
		r := m.commits.commit(lk.Context(), &o, h)
		if r.closed {
			// The stage ends at the COMMIT, not once the holds are closed.
			m.obs.Stage(StageCommit, r.committed.Sub(start))
		} else {
			m.obs.Stage(StageCommit, time.Since(start))
		}
		outcome, err := r.outcome, r.err
		if outcome == Unknown {
			// Ask MySQL, with a budget of its own (the write's may be
			// spent). Should the hold expire meanwhile, the Sweeper asks
			// the same way (a locking read) before it returns the unit,
			// and a unit goes back at most once, whoever returns it.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.WriteTimeout)
			outcome, err = resolve(rctx, m.truth, &o)
			cancel()
		}
		if outcome != NotWritten || (!errors.Is(err, errIDTaken) && !errors.Is(err, errIDCollision)) {
			return id, outcome, r.closed && outcome == Written, err
		}
		if id, err = m.ids.Next(wctx, orderIDPrefix); err != nil {
			return 0, NotWritten, false, err
		}
	}
}

// settleFailure gives back the unit a failed request took. What to give
// back depends on why it failed:
//   - already ordered: the unit goes back, but the user stays remembered
//     as a buyer, because they really hold an order;
//   - sold out in MySQL: Redis counted a unit MySQL does not have (it
//     drifted), so the unit is dropped, not given back to be sold again;
//   - anything else: the unit goes back and the user may try again.
func (m syncMode) settleFailure(ctx context.Context, h stock.Hold, cause error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	var err error
	switch {
	case errors.Is(cause, ErrSoldOut):
		err = m.stocks.Drop(ctx, h)
	case errors.Is(cause, ErrAlreadyOrdered):
		_, err = m.stocks.GiveBack(ctx, h, false)
	default:
		_, err = m.stocks.GiveBack(ctx, h, true)
	}
	if err != nil {
		// The hold is still in Redis; the Sweeper gives the unit back
		// when it expires.
		m.log.WarnContext(ctx, "give back stock; the sweeper will", "voucher", h.Voucher, "user", h.User, "err", err)
	}
}

// accepted: in sync mode every order is a row or nothing.
func (syncMode) accepted(context.Context, int64) (*Order, error) { return nil, nil }

// stockAt: in sync mode MySQL's figures are the truth; a unit under a
// hold that fails comes back by GiveBack or the Sweeper.
func (m syncMode) stockAt(ctx context.Context, voucherID int64, _ int) (snapshot, error) {
	return snapshotOf(ctx, m.truth, voucherID)
}

// quiet: orders on their way are units under holds, which Reconcile
// checks itself.
func (syncMode) quiet(context.Context, int64, int) (bool, error) { return true, nil }

// queuedOf: in sync mode no order is on its way but under its request's
// hold, which the sweeper asks MySQL about.
func (syncMode) queuedOf(context.Context, int64, int, []int64) (map[int64]int64, error) {
	return nil, nil
}

// UserLockKey is the per-user lock's key. Per user and voucher: the rule
// is one order per user per voucher, and buying two vouchers at once is
// fine.
func UserLockKey(voucherID, userID int64) string {
	return "order:" + strconv.FormatInt(voucherID, 10) + ":" + strconv.FormatInt(userID, 10)
}

// Get returns an order to its owner or an admin; to anyone else it does
// not exist.
func (s *Service) Get(ctx context.Context, id, callerID int64, admin bool) (View, error) {
	// Accepted first: async's consumer commits the row, then forgets the
	// pending marker, so one of the two reads finds the order whenever it
	// is read. MySQL first could miss it between the two.
	o, err := s.mode.accepted(ctx, id)
	if err == nil && o == nil {
		o, err = find(ctx, s.db, id)
	}
	if err != nil {
		return View{}, apperr.Down(err)
	}
	if o == nil || (!admin && o.UserID != callerID) {
		return View{}, ErrNotFound
	}
	if o.PayBy == nil && o.Status != statusCreated {
		// Not yet a row (async): its amount and deadline are the
		// voucher's, as they will be in its row.
		v, err := s.vouchers.Find(ctx, o.VoucherID)
		if err != nil {
			return View{}, err
		}
		n := newOrder(v, o.ID, o.UserID, o.CreatedAt, 0)
		o.Amount, o.PayBy = n.Amount, n.PayBy
	}
	return o.view(), nil
}
