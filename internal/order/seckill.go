package order

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/singleflight"
	"gorm.io/gorm"

	"seckill/internal/apperr"
	"seckill/internal/idworker"
	"seckill/internal/lock"
	"seckill/internal/stock"
	"seckill/internal/voucher"
)

// Config tunes the seckill path. DefaultConfig is a good start.
type Config struct {
	// WriteTimeout bounds everything between taking a unit in Redis and
	// committing the order: the lock and the transaction. It must be well
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
	// is rare (a reconciliation after Redis lost data); 0 turns it off.
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
}

// DefaultConfig suits a stock hold of 15s.
var DefaultConfig = Config{WriteTimeout: 5 * time.Second, LockTTL: 10 * time.Second, SoldOutMemo: 100 * time.Millisecond, GroupCommit: 100}

// Service sells vouchers. It is safe for concurrent use.
type Service struct {
	db       *gorm.DB
	rdb      redis.UniversalClient
	vouchers *voucher.Service
	stocks   *stock.Store
	locks    lock.Locker
	ids      *idworker.Worker
	pool     *idworker.Pool // order IDs, drawn a block at a time
	now      func() time.Time
	log      *slog.Logger
	cfg      Config
	obs      Observer // cfg.Observer, or nobody

	mode mode // sync or async: how a unit becomes an order

	soldOut sync.Map // voucher ID -> time.Time until which it is known sold out
	buyers  buyerMemo
	writes  writer
	flights singleflight.Group // seed and reload: one attempt per instance at a time

	// The flights' lifetime: Close cancels them and waits for them, so
	// that none outlives the service and meets closed clients, leaving
	// its lock to expire on its own.
	flightsDone context.Context
	endFlights  context.CancelFunc
	flyMu       sync.Mutex
	flying      sync.WaitGroup
	closed      bool
}

// mode is the one thing sync and async mode do differently: how a unit of
// stock becomes an order once the sale window is checked. Sync mode
// (syncMode, below) writes the row before it answers; async mode
// (asyncMode, async.go) queues the order in Redis for a consumer to write.
// Everything else (the window, the memories, reloading Redis, the sweeper)
// is theirs in common, and asks the mode where the two differ.
type mode interface {
	// place takes a unit of v for userID, makes it an order (or gives it
	// back), and returns the order's ID.
	place(ctx context.Context, v *voucher.Voucher, userID int64) (int64, error)
	// accepted returns an order taken but not yet a row, or nil.
	accepted(ctx context.Context, id int64) (*Order, error)
	// stockAt reads, as of one moment, the units of voucherID left and its
	// buyers, counting the orders on their way to MySQL: what a reload
	// puts back in Redis after Redis lost it.
	stockAt(ctx context.Context, voucherID int64) (left int64, buyers []int64, err error)
	// quiet reports whether no order of voucherID is on its way to MySQL,
	// so that Redis' count may be compared with MySQL's.
	quiet(ctx context.Context, voucherID int64) (bool, error)
}

// NewService returns a Service.
func NewService(db *gorm.DB, rdb redis.UniversalClient, vouchers *voucher.Service, stocks *stock.Store, locks lock.Locker, ids *idworker.Worker, now func() time.Time, log *slog.Logger, cfg Config) *Service {
	s := &Service{db: db, rdb: rdb, vouchers: vouchers, stocks: stocks, locks: locks, ids: ids, now: now, log: log, cfg: cfg,
		writes: writer{in: make(chan *write), max: max(cfg.GroupCommit, 1)}}
	s.pool = ids.NewPool(orderIDPrefix, s.seed)
	s.obs = cfg.Observer
	if s.obs == nil {
		s.obs = nobody{}
	}
	s.mode = syncMode{s}
	if cfg.Async {
		s.mode = asyncMode{s}
	}
	s.flightsDone, s.endFlights = context.WithCancel(context.Background())
	return s
}

// Close ends the service's own background attempts (seed, reload) and
// waits for them. Call it after the last request, before closing the
// clients the service was given.
func (s *Service) Close() {
	s.flyMu.Lock()
	s.closed = true
	s.flyMu.Unlock()
	if s.endFlights != nil {
		s.endFlights()
	}
	s.flying.Wait()
}

// Seckill takes one unit of voucherID for userID and returns the new
// order's ID. In sync mode the order row is committed before it returns; in
// async mode the order is in Redis, on its way to MySQL.
func (s *Service) Seckill(ctx context.Context, userID, voucherID int64) (int64, error) {
	// Guard 1: the voucher exists and its sale is open. From memory.
	v, err := s.vouchers.Find(ctx, voucherID)
	if err != nil {
		return 0, err
	}
	if err := v.Open(s.now()); err != nil {
		return 0, err
	}
	if s.knownSoldOut(voucherID) {
		return 0, ErrSoldOut
	}
	if s.knownBuyer(voucherID, userID) {
		return 0, ErrAlreadyOrdered
	}
	return s.mode.place(ctx, v, userID)
}

// syncMode writes the order row before the request answers: a 200 is a
// committed row.
type syncMode struct{ *Service }

// place is sync mode's way from a unit of stock to an order row.
func (m syncMode) place(ctx context.Context, v *voucher.Voucher, userID int64) (int64, error) {
	s := m.Service
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
	id, outcome, err := m.write(ctx, voucherID, userID, id)
	switch outcome {
	case NotWritten:
		m.settleFailure(ctx, h, err)
		if errors.Is(err, ErrAlreadyOrdered) || errors.Is(err, ErrSoldOut) || errors.Is(err, ErrBusy) {
			return 0, err
		}
		return 0, apperr.Down(err)
	case Unknown:
		s.log.WarnContext(ctx, "order outcome unknown: MySQL did not answer its COMMIT; the sweeper settles the hold",
			"voucher", voucherID, "user", userID, "order", id, "err", err)
		return 0, apperr.Down(fmt.Errorf("order %d: outcome unknown: %w", id, err))
	}

	// Close the hold. The order is committed whatever happens here: if
	// Redis fails now, the Sweeper finds the expired hold, sees the row,
	// and closes it then.
	if _, err := s.stocks.Confirm(context.WithoutCancel(ctx), h); err != nil {
		s.log.WarnContext(ctx, "confirm hold; the sweeper will", "voucher", voucherID, "user", userID, "err", err)
	}
	s.rememberBuyer(voucherID, userID, true)
	return id, nil
}

// take runs the stock script, reloading the voucher's stock from MySQL if
// Redis lost it, then draws the order's ID: only for the requests that
// took a unit, so the rejected majority never touches the ID pool.
func (m syncMode) take(ctx context.Context, v *voucher.Voucher, userID int64) (stock.Hold, int64, error) {
	s := m.Service
	voucherID := v.ID
	for attempt := 0; ; attempt++ {
		// Timed with the real clock, not s.now: a latency is not a date.
		start := time.Now()
		h, res, err := s.stocks.Take(ctx, voucherID, v.Parts(), userID)
		s.obs.Stage(StageStock, time.Since(start))
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
			ictx, cancel := context.WithTimeout(ctx, s.cfg.WriteTimeout)
			id, err := s.pool.Next(ictx)
			cancel()
			if err != nil {
				m.settleFailure(ctx, h, err)
				return h, 0, s.idError(err)
			}
			return h, id, nil
		case stock.SoldOut:
			s.rememberSoldOut(voucherID)
			return h, 0, ErrSoldOut
		case stock.SoldOutForNow:
			return h, 0, ErrSoldOut
		case stock.AlreadyBought:
			s.rememberBuyer(voucherID, userID, true)
			return h, 0, ErrAlreadyOrdered
		case stock.AlreadyBuying:
			return h, 0, busyRetry() // the other request may yet fail: try again
		case stock.Missing:
			// Redis was flushed or restarted.
			if err := s.restore(ctx, voucherID, v.Parts(), attempt); err != nil {
				return h, 0, err
			}
			continue
		}
		return h, 0, fmt.Errorf("take stock: unknown answer %d from the script", res)
	}
}

// busyRetry is ErrBusy with a Retry-After of a second: the other request
// of the user that holds the unit or the lock is done within milliseconds
// when all is well, and the lock lasts at most its TTL when it is not.
func busyRetry() error { return apperr.RetryAfter(ErrBusy, time.Second) }

// idError is what a request answers when it could not draw an order ID:
// ErrIDsExhausted with a Retry-After until the next UTC day, whose
// sequence starts afresh, or Redis being away.
func (s *Service) idError(err error) error {
	if !errors.Is(err, idworker.ErrSequenceExhausted) {
		return apperr.Down(err)
	}
	now := s.now().UTC()
	return apperr.RetryAfter(ErrIDsExhausted, now.Truncate(24*time.Hour).Add(24*time.Hour).Sub(now))
}

// orderIDPrefix names the order-ID sequence: icr:order:{yyyy:MM:dd}.
const orderIDPrefix = "order"

// write writes the order under the user's lock, within WriteTimeout, and
// returns its ID (id, or a new one if id was already used: see errIDTaken)
// and what became of it.
func (m syncMode) write(ctx context.Context, voucherID, userID, id int64) (int64, Outcome, error) {
	s := m.Service
	wctx, cancel := context.WithTimeout(ctx, s.cfg.WriteTimeout)
	defer cancel()

	// Guard 3: the per-user lock. Taken after the stock script so that the
	// rejected majority never pays for it. Try once: a second request of
	// the same user is told to come back, not queued.
	start := time.Now()
	lk, err := s.locks.Obtain(wctx, UserLockKey(voucherID, userID), s.cfg.LockTTL, lock.WithWatchdog(s.cfg.WriteTimeout))
	s.obs.Stage(StageLock, time.Since(start))
	if errors.Is(err, lock.ErrNotAcquired) {
		s.obs.UserLock(LockContended)
		return 0, NotWritten, busyRetry()
	}
	if err != nil {
		return 0, NotWritten, err
	}
	s.obs.UserLock(LockObtained)
	defer func() {
		err := lk.Release(context.WithoutCancel(wctx))
		if errors.Is(err, lock.ErrNotHeld) {
			// Released only here, so not held means lost on the way.
			s.obs.UserLock(LockLost)
		} else if err != nil {
			s.log.WarnContext(wctx, "release user lock; it expires by itself", "key", lk.Key(), "err", err)
		}
	}()

	// Guard 4: MySQL, in one transaction with the orders of the requests
	// that arrived together (writer.go). It runs under the lock's context:
	// if the watchdog finds the lock lost, the order is not written, or its
	// transaction rolls back, instead of committing unprotected.
	for {
		o := &Order{ID: id, UserID: userID, VoucherID: voucherID, Status: StatusCreated, CreatedAt: s.now().UTC().Truncate(time.Millisecond)}
		start := time.Now()
		outcome, err := s.commit(lk.Context(), o)
		s.obs.Stage(StageCommit, time.Since(start))
		if outcome == Unknown {
			// Ask MySQL, with a budget of its own (the write's may be
			// spent). Should the hold expire meanwhile, the Sweeper asks
			// the same way (a locking read) before it returns the unit,
			// and a unit goes back at most once, whoever returns it.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.WriteTimeout)
			outcome, err = resolve(rctx, s.db, o)
			cancel()
		}
		if outcome != NotWritten || (!errors.Is(err, errIDTaken) && !errors.Is(err, ErrIDCollision)) {
			return id, outcome, err
		}
		if id, err = s.ids.Next(wctx, orderIDPrefix); err != nil {
			return 0, NotWritten, err
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
	s := m.Service
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	var err error
	switch {
	case errors.Is(cause, ErrSoldOut):
		err = s.stocks.Drop(ctx, h)
	case errors.Is(cause, ErrAlreadyOrdered):
		_, err = s.stocks.GiveBack(ctx, h, false)
	default:
		_, err = s.stocks.GiveBack(ctx, h, true)
	}
	if err != nil {
		// The hold is still in Redis; the Sweeper gives the unit back
		// when it expires.
		s.log.WarnContext(ctx, "give back stock; the sweeper will", "voucher", h.Voucher, "user", h.User, "err", err)
	}
}

// accepted: in sync mode every order is a row or nothing.
func (syncMode) accepted(context.Context, int64) (*Order, error) { return nil, nil }

// stockAt: in sync mode MySQL's figures are the truth; a unit under a
// hold that fails comes back by GiveBack or the Sweeper.
func (m syncMode) stockAt(ctx context.Context, voucherID int64) (int64, []int64, error) {
	return snapshot(ctx, m.db, voucherID)
}

// quiet: orders on their way are units under holds, which Reconcile
// checks itself.
func (syncMode) quiet(context.Context, int64) (bool, error) { return true, nil }

// restore puts back the voucher's stock keys that a script found missing
// (Redis was flushed or restarted). attempt counts the tries; two are
// allowed: more than that, and Redis is losing its keys faster than they
// are put back.
func (s *Service) restore(ctx context.Context, voucherID int64, buckets, attempt int) error {
	if attempt == maxRestores {
		return apperr.Down(fmt.Errorf("keys of voucher %d still missing after restoring them", voucherID))
	}
	return s.reload(ctx, voucherID, buckets)
}

const maxRestores = 2

// seed starts the day's order-ID sequence (idworker.Seed), for the ID
// pool when it finds the sequence missing (the sweeper seeds each day
// ahead, so this is rare: a Redis that lost its keys, a first start). The
// pool refills one caller at a time, and alone shares an attempt among
// the callers of one instance; across instances the lock makes one of them
// ask MySQL while the rest wait for it and then find it there. (The
// sweeper seeds ahead with idworker's Seed directly: SET NX keeps the
// first of any seeds that race.)
func (s *Service) seed(ctx context.Context, day time.Time) error {
	return s.alone(ctx, "seed:"+idworker.Key(orderIDPrefix, day), func(ctx context.Context) error {
		lk, err := s.locks.Obtain(ctx, "id-seed:"+orderIDPrefix, s.cfg.LockTTL, lock.Wait())
		if err != nil {
			return apperr.Down(fmt.Errorf("lock seeding of order IDs: %w", err))
		}
		defer lk.Release(context.WithoutCancel(ctx))
		return apperr.Down(s.ids.Seed(ctx, orderIDPrefix, day))
	})
}

// reload rebuilds a voucher's Redis keys from MySQL. A thousand requests
// may find the key missing at once: as with seed, they share one attempt
// per instance, and the lock makes one instance read MySQL while the rest
// wait for it (without polling) and then find the key there.
func (s *Service) reload(ctx context.Context, voucherID int64, buckets int) error {
	return s.alone(ctx, "reload:"+strconv.FormatInt(voucherID, 10), func(ctx context.Context) error {
		lk, err := s.locks.Obtain(ctx, "stock-reload:"+strconv.FormatInt(voucherID, 10), s.cfg.LockTTL, lock.Wait())
		if err != nil {
			return apperr.Down(fmt.Errorf("lock reload of voucher %d: %w", voucherID, err))
		}
		defer lk.Release(context.WithoutCancel(ctx))
		if _, ok, err := s.stocks.Left(ctx, voucherID, buckets); err != nil || ok {
			return apperr.Down(err) // nil if another instance reloaded it
		}
		left, buyers, err := s.mode.stockAt(ctx, voucherID)
		if err != nil {
			return apperr.Down(err)
		}
		if _, err := s.stocks.Load(ctx, voucherID, buckets, left, buyers); err != nil {
			return apperr.Down(err)
		}
		s.log.InfoContext(ctx, "reloaded stock from MySQL", "voucher", voucherID, "stock", left, "buyers", len(buyers))
		return nil
	})
}

// alone runs fn once for all the callers that ask for key at the same
// time, and gives each the result. fn runs for WriteTimeout on a context
// of its own: the first caller leaving must not fail the others. A caller
// leaves when its own context ends, with that context's error.
func (s *Service) alone(ctx context.Context, key string, fn func(context.Context) error) error {
	ch := s.flights.DoChan(key, func() (any, error) { return nil, s.flight(ctx, fn) })
	select {
	case r := <-ch:
		return r.Err
	case <-ctx.Done():
		return apperr.Down(ctx.Err())
	}
}

var errClosed = apperr.Down(errors.New("order service closed"))

// flight runs one attempt of alone. A panic in it becomes an error: it
// runs on singleflight's goroutine, where no handler's recovery reaches,
// and singleflight would re-raise it there and end the process.
func (s *Service) flight(ctx context.Context, fn func(context.Context) error) (err error) {
	s.flyMu.Lock()
	if s.closed {
		s.flyMu.Unlock()
		return errClosed
	}
	s.flying.Add(1)
	s.flyMu.Unlock()
	defer s.flying.Done()
	defer func() {
		if p := recover(); p != nil {
			s.log.ErrorContext(ctx, "panic in a seed or reload", "panic", p, "stack", string(debug.Stack()))
			err = fmt.Errorf("panic: %v", p) // not an apperr: answered as internal
		}
	}()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.WriteTimeout)
	defer cancel()
	if s.flightsDone != nil {
		defer context.AfterFunc(s.flightsDone, cancel)()
	}
	return fn(ctx)
}

// UserLockKey is the per-user lock's key. Per user and voucher: the rule
// is one order per user per voucher, and buying two vouchers at once is
// fine.
func UserLockKey(voucherID, userID int64) string {
	return "order:" + strconv.FormatInt(voucherID, 10) + ":" + strconv.FormatInt(userID, 10)
}

// buyerMemo remembers users who bought a voucher, so that their repeated
// clicks are answered already_ordered from memory. In sync mode the order
// is a committed row, which never goes away: the entry is kept for good.
// In async mode the order is only accepted: MySQL may still refuse it, and
// its dead letter frees the buyer to buy again (or Redis may lose it), so
// the entry lasts unsettledBuyerMemo, long enough to absorb a burst of
// clicks, short enough that a freed buyer is not turned away for long. A
// shard forgets everything when it grows past its share of maxBuyerMemo,
// to bound memory.
//
// The maps hold no pointer (keys and deadlines are numbers), so the
// garbage collector never scans a sale's hundreds of thousands of buyers,
// as it must a sync.Map's boxed keys and times.
type buyerMemo struct {
	shards [64]buyerShard
}

type buyerShard struct {
	mu sync.RWMutex
	m  map[[2]int64]int64 // {voucher, user} -> Unix nanoseconds until which it holds; 0: for good
}

const (
	maxBuyerMemo       = 1 << 20
	unsettledBuyerMemo = time.Second
)

func (b *buyerMemo) shard(voucherID, userID int64) *buyerShard {
	return &b.shards[uint64(userID+voucherID)%uint64(len(b.shards))]
}

func (s *Service) knownBuyer(voucherID, userID int64) bool {
	sh := s.buyers.shard(voucherID, userID)
	sh.mu.RLock()
	until, ok := sh.m[[2]int64{voucherID, userID}]
	sh.mu.RUnlock()
	return ok && (until == 0 || s.now().UnixNano() < until)
}

// rememberBuyer remembers that userID bought voucherID; settled says the
// order is a committed row.
func (s *Service) rememberBuyer(voucherID, userID int64, settled bool) {
	var until int64
	if !settled {
		until = s.now().Add(unsettledBuyerMemo).UnixNano()
	}
	sh := s.buyers.shard(voucherID, userID)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.m == nil || len(sh.m) >= maxBuyerMemo/len(s.buyers.shards) {
		sh.m = map[[2]int64]int64{}
	}
	sh.m[[2]int64{voucherID, userID}] = until
}

func (s *Service) knownSoldOut(voucherID int64) bool {
	until, ok := s.soldOut.Load(voucherID)
	return ok && s.now().Before(until.(time.Time))
}

func (s *Service) rememberSoldOut(voucherID int64) {
	if s.cfg.SoldOutMemo > 0 {
		s.soldOut.Store(voucherID, s.now().Add(s.cfg.SoldOutMemo))
	}
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
	return o.view(), nil
}
