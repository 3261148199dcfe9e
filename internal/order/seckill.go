package order

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
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
	// Persister (async.go); otherwise the row is written in the request.
	Async bool
	// GroupCommit is the most orders of concurrent requests written in one
	// transaction in sync mode (writer.go); 1 writes each on its own.
	GroupCommit int
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
	now      func() time.Time
	log      *slog.Logger
	cfg      Config

	soldOut sync.Map // voucher ID -> time.Time until which it is known sold out
	buyers  buyerMemo
	writes  writer
}

// NewService returns a Service.
func NewService(db *gorm.DB, rdb redis.UniversalClient, vouchers *voucher.Service, stocks *stock.Store, locks lock.Locker, ids *idworker.Worker, now func() time.Time, log *slog.Logger, cfg Config) *Service {
	return &Service{db: db, rdb: rdb, vouchers: vouchers, stocks: stocks, locks: locks, ids: ids, now: now, log: log, cfg: cfg,
		writes: writer{in: make(chan *write), max: max(cfg.GroupCommit, 1)}}
}

// Seckill takes one unit of voucherID for userID and returns the new
// order's ID. The order row is committed before it returns.
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
	if s.cfg.Async {
		return s.accept(ctx, voucherID, userID)
	}

	// Guard 2: take a unit in Redis, atomically with the stock and
	// one-per-user checks. Most requests of a flash sale end here.
	id, err := s.take(ctx, voucherID, userID)
	if err != nil {
		return 0, err
	}

	// From here on this request holds a unit. Every way out either turns
	// it into an order row or gives it back.
	id, err = s.place(ctx, voucherID, userID, id)
	if err != nil {
		s.settleFailure(ctx, voucherID, userID, err)
		if errors.Is(err, ErrAlreadyOrdered) || errors.Is(err, ErrSoldOut) || errors.Is(err, ErrBusy) {
			return 0, err
		}
		return 0, apperr.Down(err)
	}

	// Close the hold. The order is committed whatever happens here: if
	// Redis fails now, the Sweeper finds the expired hold, sees the row,
	// and closes it then.
	if _, err := s.stocks.Confirm(context.WithoutCancel(ctx), voucherID, userID); err != nil {
		s.log.WarnContext(ctx, "confirm hold; the sweeper will", "voucher", voucherID, "user", userID, "err", err)
	}
	s.rememberBuyer(voucherID, userID)
	return id, nil
}

// take runs the stock script, which also draws the order's ID, reloading
// the voucher's stock from MySQL if Redis lost it.
func (s *Service) take(ctx context.Context, voucherID, userID int64) (int64, error) {
	for attempt := 0; ; attempt++ {
		slot, err := idworker.SlotAt(orderIDPrefix, s.now())
		if err != nil {
			return 0, err
		}
		res, id, err := s.stocks.Take(ctx, voucherID, userID, slot)
		if err != nil {
			// Nothing taken; or, if only the reply was lost, a unit under
			// a hold that the sweeper gives back.
			return 0, apperr.Down(err)
		}
		switch res {
		case stock.Taken:
			return id, nil
		case stock.SoldOut:
			s.rememberSoldOut(voucherID)
			return 0, ErrSoldOut
		case stock.SoldOutForNow:
			return 0, ErrSoldOut
		case stock.AlreadyBought:
			s.rememberBuyer(voucherID, userID)
			return 0, ErrAlreadyOrdered
		case stock.AlreadyBuying:
			return 0, ErrBusy // the other request may yet fail: try again
		case stock.IDsExhausted:
			return 0, ErrIDsExhausted
		}
		// stock.Missing: Redis was flushed or restarted.
		if attempt == 2 {
			return 0, apperr.Down(fmt.Errorf("stock of voucher %d still missing after reloading", voucherID))
		}
		if err := s.reload(ctx, voucherID); err != nil {
			return 0, err
		}
	}
}

// orderIDPrefix names the order-ID sequence: icr:order:{yyyy:MM:dd}.
const orderIDPrefix = "order"

// place writes the order under the user's lock, within WriteTimeout, and
// returns its ID: id, or a new one if id was already used (see errIDTaken).
func (s *Service) place(ctx context.Context, voucherID, userID, id int64) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.WriteTimeout)
	defer cancel()

	// Guard 3: the per-user lock. Taken after the stock script so that the
	// rejected majority never pays for it. Try once: a second request of
	// the same user is told to come back, not queued.
	lk, err := s.locks.Obtain(ctx, UserLockKey(voucherID, userID), s.cfg.LockTTL, lock.WithWatchdog(s.cfg.WriteTimeout))
	if errors.Is(err, lock.ErrNotAcquired) {
		return 0, ErrBusy
	}
	if err != nil {
		return 0, err
	}
	defer func() {
		if err := lk.Release(context.WithoutCancel(ctx)); err != nil && !errors.Is(err, lock.ErrNotHeld) {
			s.log.WarnContext(ctx, "release user lock; it expires by itself", "key", lk.Key(), "err", err)
		}
	}()

	// Guard 4: MySQL, in one transaction with the orders of the requests
	// that arrived together (writer.go). It runs under the lock's context:
	// if the watchdog finds the lock lost, the order is not written, or its
	// transaction rolls back, instead of committing unprotected.
	for {
		o := &Order{ID: id, UserID: userID, VoucherID: voucherID, Status: StatusCreated, CreatedAt: s.now().UTC().Truncate(time.Millisecond)}
		err := s.commit(lk.Context(), o)
		if !errors.Is(err, errIDTaken) && !errors.Is(err, errIDCollision) {
			return id, err
		}
		if id, err = s.ids.Next(ctx, orderIDPrefix); err != nil {
			return 0, err
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
func (s *Service) settleFailure(ctx context.Context, voucherID, userID int64, cause error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	var err error
	switch {
	case errors.Is(cause, ErrSoldOut):
		err = s.stocks.Drop(ctx, voucherID, userID)
	case errors.Is(cause, ErrAlreadyOrdered):
		_, err = s.stocks.GiveBack(ctx, voucherID, userID, false)
	default:
		_, err = s.stocks.GiveBack(ctx, voucherID, userID, true)
	}
	if err != nil {
		// The hold is still in Redis; the Sweeper gives the unit back
		// when it expires.
		s.log.WarnContext(ctx, "give back stock; the sweeper will", "voucher", voucherID, "user", userID, "err", err)
	}
}

// reload rebuilds a voucher's Redis keys from MySQL. A thousand requests
// may find the key missing at once; the lock makes one of them read MySQL
// while the rest wait for it (without polling) and then find the key there.
func (s *Service) reload(ctx context.Context, voucherID int64) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.WriteTimeout)
	defer cancel()
	lk, err := s.locks.Obtain(ctx, "stock-reload:"+strconv.FormatInt(voucherID, 10), s.cfg.LockTTL, lock.Wait())
	if err != nil {
		return apperr.Down(fmt.Errorf("lock reload of voucher %d: %w", voucherID, err))
	}
	defer lk.Release(context.WithoutCancel(ctx))
	if _, ok, err := s.stocks.Left(ctx, voucherID); err != nil || ok {
		return apperr.Down(err) // nil if another request reloaded it
	}
	read := snapshot
	if s.cfg.Async {
		read = s.queued // orders accepted but not yet written hold units too
	}
	left, buyers, err := read(ctx, s.db, voucherID)
	if err != nil {
		return apperr.Down(err)
	}
	if _, err := s.stocks.Load(ctx, voucherID, left, buyers); err != nil {
		return apperr.Down(err)
	}
	s.log.InfoContext(ctx, "reloaded stock from MySQL", "voucher", voucherID, "stock", left, "buyers", len(buyers))
	return nil
}

// UserLockKey is the per-user lock's key. Per user and voucher: the rule
// is one order per user per voucher, and buying two vouchers at once is
// fine.
func UserLockKey(voucherID, userID int64) string {
	return "order:" + strconv.FormatInt(voucherID, 10) + ":" + strconv.FormatInt(userID, 10)
}

// buyerMemo remembers users whose order for a voucher is settled, so
// that their repeated clicks are answered already_ordered from memory. A
// settled order never goes away, so an entry never goes stale; the memo
// only forgets everything when it grows past maxBuyerMemo, to bound memory.
type buyerMemo struct {
	m sync.Map // [2]int64{voucher, user} -> struct{}
	n atomic.Int64
}

const maxBuyerMemo = 1 << 20

func (s *Service) knownBuyer(voucherID, userID int64) bool {
	_, ok := s.buyers.m.Load([2]int64{voucherID, userID})
	return ok
}

func (s *Service) rememberBuyer(voucherID, userID int64) {
	if _, loaded := s.buyers.m.LoadOrStore([2]int64{voucherID, userID}, struct{}{}); !loaded {
		if s.buyers.n.Add(1) > maxBuyerMemo {
			s.buyers.m.Clear()
			s.buyers.n.Store(0)
		}
	}
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
	var o *Order
	var err error
	if s.cfg.Async {
		// Pending first: the persister commits the row, then forgets the
		// marker, so one of the two reads finds the order whenever it is
		// read. MySQL first could miss it between the two.
		o, err = s.findPending(ctx, id)
	}
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
