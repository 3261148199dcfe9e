package voucher

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"gorm.io/gorm"

	"seckill/internal/apperr"
	"seckill/internal/fleet"
	"seckill/internal/lock"
	"seckill/internal/room"
	"seckill/internal/stock"
)

// idempotencyWindow is how long an Idempotency-Key is remembered: long
// enough to cover a double click and a client's quick retries.
const idempotencyWindow = 10 * time.Second

// MaxStock bounds a voucher's stock to what the INT column holds.
const MaxStock = 1<<31 - 1

// Bounds and defaults of a voucher's price (cents) and time to pay
// (seconds), as the contract gives them.
const (
	MaxPrice         = 100_000_000
	MaxPayWithin     = 86_400
	DefaultPayWithin = 900
)

// CreateInput is the body of POST /vouchers. Pointers tell a missing field
// from a zero one.
type CreateInput struct {
	Title     *string    `json:"title"`
	Stock     *int64     `json:"stock"`
	BeginTime *time.Time `json:"begin_time"`
	EndTime   *time.Time `json:"end_time"`
	// Buckets splits the stock over that many Redis keys in different
	// cluster slots (1 when absent): for a voucher too hot for one Redis.
	Buckets *int `json:"buckets"`
	// Price in cents (0 when absent); PayWithin in seconds (900 when
	// absent).
	Price     *int64 `json:"price"`
	PayWithin *int   `json:"pay_within"`
	// Room gives the voucher a waiting room (package room); absent or
	// null: none.
	Room *room.Input `json:"room"`
}

// Guard refuses a repeated submission: Once fails if key was used within
// ttl. internal/lock's one-shot lock is one.
type Guard interface {
	Once(ctx context.Context, key string, ttl time.Duration) error
}

// Service creates and reads vouchers.
type Service struct {
	db     *gorm.DB
	stocks *stock.Store
	rooms  *room.Store
	guard  Guard
	cache  *cache
	now    func() time.Time
	log    *slog.Logger
	// fleet, if set (SetFleet), is asked before a voucher whose feature
	// an older instance cannot serve is made; async: this server queues
	// orders in async mode.
	fleet Fleet
	async bool
}

// Fleet tells whether every instance alive can serve a feature (package
// fleet): an error, *fleet.Blocked, names one that cannot.
type Fleet interface {
	Require(ctx context.Context, needs ...fleet.Need) error
}

// SetFleet makes Create refuse, while an older instance that cannot
// serve it is alive, a voucher with a waiting room, and in async mode
// (async) a voucher split into buckets (fleet.Room, fleet.SplitInAsync).
// Call it before serving. Without it nobody is asked: the tests of other
// packages, which run one version.
func (s *Service) SetFleet(f Fleet, async bool) {
	s.fleet, s.async = f, async
}

// needs are the features of v that not every version serves.
func (s *Service) needs(v *Voucher) []fleet.Need {
	var needs []fleet.Need
	if v.Room() != nil {
		needs = append(needs, fleet.Room)
	}
	if s.async && v.Buckets > 1 {
		needs = append(needs, fleet.SplitInAsync)
	}
	return needs
}

// NewService returns a Service. rooms keeps the waiting rooms' lines; nil
// refuses vouchers with a room.
func NewService(db *gorm.DB, stocks *stock.Store, rooms *room.Store, guard Guard, now func() time.Time, log *slog.Logger) *Service {
	return &Service{db: db, stocks: stocks, rooms: rooms, guard: guard, cache: newCache(now), now: now, log: log}
}

func (in CreateInput) validate(now time.Time) (*Voucher, error) {
	switch {
	case in.Title == nil || strings.TrimSpace(*in.Title) == "":
		return nil, apperr.Invalid("title is required")
	case utf8.RuneCountInString(*in.Title) > 255:
		return nil, apperr.Invalid("title is longer than 255 characters")
	case in.Stock == nil:
		return nil, apperr.Invalid("stock is required")
	case *in.Stock < 0 || *in.Stock > MaxStock:
		return nil, apperr.Invalid(fmt.Sprintf("stock must be between 0 and %d", MaxStock))
	case in.BeginTime == nil || in.EndTime == nil:
		return nil, apperr.Invalid("begin_time and end_time are required (RFC 3339)")
	case in.Buckets != nil && (*in.Buckets < 1 || *in.Buckets > stock.MaxBuckets):
		return nil, apperr.Invalid(fmt.Sprintf("buckets must be between 1 and %d", stock.MaxBuckets))
	case in.Price != nil && (*in.Price < 0 || *in.Price > MaxPrice):
		return nil, apperr.Invalid(fmt.Sprintf("price must be between 0 and %d (cents)", MaxPrice))
	case in.PayWithin != nil && (*in.PayWithin < 1 || *in.PayWithin > MaxPayWithin):
		return nil, apperr.Invalid(fmt.Sprintf("pay_within must be between 1 and %d (seconds)", MaxPayWithin))
	}
	// DATETIME keeps whole seconds; truncating here makes what we answer
	// equal what we store.
	begin, end := in.BeginTime.UTC().Truncate(time.Second), in.EndTime.UTC().Truncate(time.Second)
	if !begin.Before(end) {
		return nil, apperr.Invalid("begin_time must be before end_time")
	}
	if begin.Year() < 1970 || end.Year() > 9999 {
		return nil, apperr.Invalid("times must lie between 1970 and 9999")
	}
	v := &Voucher{
		Title: strings.TrimSpace(*in.Title), Stock: *in.Stock, InitialStock: *in.Stock,
		BeginTime: begin, EndTime: end, Buckets: 1, PayWithin: DefaultPayWithin,
	}
	if in.Buckets != nil {
		v.Buckets = *in.Buckets
	}
	if in.Price != nil {
		v.Price = *in.Price
	}
	if in.PayWithin != nil {
		v.PayWithin = *in.PayWithin
	}
	if in.Room != nil {
		if v.Buckets > 1 {
			return nil, apperr.Invalid("a voucher with a waiting room cannot be split into buckets: its line and its stock share one Redis slot")
		}
		c, err := in.Room.Config(now.UTC().Truncate(time.Millisecond), begin)
		if err != nil {
			return nil, err
		}
		hold := int(c.HoldFor / time.Second)
		v.RoomOpensAt, v.RoomAdmitPerSecond, v.RoomHoldFor = &c.OpensAt, &c.AdmitPerSecond, &hold
		v.RoomSeed = make([]byte, room.SeedSize)
		rand.Read(v.RoomSeed) // crypto/rand: the draw's order must not be guessable before begin_time
	}
	return v, nil
}

// Create stores a voucher and puts its stock in Redis before returning.
// A non-empty idemKey makes the call one-shot for a few seconds: a double
// click or a client retry with the same key is refused instead of creating
// the voucher twice.
func (s *Service) Create(ctx context.Context, adminID int64, idemKey string, in CreateInput) (View, error) {
	v, err := in.validate(s.now())
	if err != nil {
		return View{}, err
	}
	if v.Room() != nil && s.rooms == nil {
		return View{}, apperr.Invalid("this server keeps no waiting rooms")
	}
	// Before the idempotency key is spent: the admin retries the same
	// request once the upgrade is over.
	if s.fleet != nil {
		if err := s.fleet.Require(ctx, s.needs(v)...); err != nil {
			if errors.Is(err, fleet.ErrUpgradePending) {
				return View{}, err
			}
			return View{}, apperr.Down(err)
		}
	}
	if idemKey != "" && s.guard != nil {
		err := s.guard.Once(ctx, fmt.Sprintf("idem:voucher:%d:%s", adminID, idemKey), idempotencyWindow)
		if err != nil {
			if errors.Is(err, lock.ErrNotAcquired) {
				return View{}, ErrDuplicate
			}
			return View{}, apperr.Down(err)
		}
	}
	v.CreatedAt = time.Now().UTC().Truncate(time.Second)
	if err := s.db.WithContext(ctx).Create(v).Error; err != nil {
		return View{}, apperr.Down(fmt.Errorf("insert voucher: %w", err))
	}
	if err := s.stocks.Init(ctx, v.ID, v.Stock, v.Parts()); err != nil {
		// Without its stock in Redis the voucher could still be sold
		// (the seckill path reloads missing stock), but the contract
		// promises it is ready at 201; undo and report instead.
		if derr := s.db.WithContext(context.WithoutCancel(ctx)).Delete(&Voucher{}, v.ID).Error; derr != nil {
			s.log.ErrorContext(ctx, "undo voucher after Redis failed", "voucher", v.ID, "err", derr)
		}
		return View{}, apperr.Down(err)
	}
	s.cache.put(v)
	out := v.view(v.Stock)
	if sale := v.Room(); sale != nil {
		rv := room.ConfigView(*sale, s.now())
		out.Room = &rv
	}
	return out, nil
}

// Rooms lists the vouchers with a waiting room whose sale has not ended
// (room.Lister): what every instance's Admitter looks after. One small
// query a second per instance.
func (s *Service) Rooms(ctx context.Context) ([]int64, error) {
	var ids []int64
	err := s.db.WithContext(ctx).Model(&Voucher{}).Where("room_admit_per_second IS NOT NULL AND end_time > ?", s.now().UTC().Add(-time.Minute)).Pluck("id", &ids).Error
	if err != nil {
		return nil, fmt.Errorf("list the vouchers with a room: %w", err)
	}
	return ids, nil
}

// withRoom adds v's room, as it is now, to out.
func (s *Service) withRoom(ctx context.Context, v *Voucher, out View) (View, error) {
	sale := v.Room()
	if sale == nil || s.rooms == nil {
		return out, nil
	}
	rv, err := s.rooms.View(ctx, *sale)
	if errors.Is(err, room.ErrStockMissing) {
		// Redis lost the voucher's keys (or forgot them, a day after the
		// sale): the room as its settings say, sold out by the stock out
		// already holds (MySQL's, then), as for a voucher without a room.
		rv, err = room.ConfigView(*sale, s.now()), nil
		if out.Stock <= 0 {
			rv.State = room.RoomSoldOut
		}
	}
	if err != nil {
		return View{}, err
	}
	out.Room = &rv
	return out, nil
}

// Get returns a voucher with the stock still sellable.
func (s *Service) Get(ctx context.Context, id int64) (View, error) {
	v, err := s.Find(ctx, id)
	if err != nil {
		return View{}, err
	}
	left, ok, err := s.stocks.Left(ctx, id, v.Parts())
	if err != nil {
		return View{}, apperr.Down(err)
	}
	if !ok {
		// Redis lost the key; MySQL's figure is the truth until the next
		// seckill request reloads it.
		var row Voucher
		if err := s.db.WithContext(ctx).Select("stock").Take(&row, id).Error; err != nil {
			return View{}, apperr.Down(fmt.Errorf("read stock of voucher %d: %w", id, err))
		}
		left = row.Stock
	}
	return s.withRoom(ctx, v, v.view(max(left, 0)))
}

// Find returns a voucher's metadata, from memory after the first call.
// The Stock field is a snapshot; never sell from it.
func (s *Service) Find(ctx context.Context, id int64) (*Voucher, error) {
	v, err := s.cache.get(ctx, id, s.load)
	if err != nil {
		return nil, apperr.Down(err)
	}
	if v == nil {
		return nil, ErrNotFound
	}
	return v, nil
}

func (s *Service) load(ctx context.Context, id int64) (*Voucher, error) {
	var v Voucher
	err := s.db.WithContext(ctx).Take(&v, id).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("load voucher %d: %w", id, err)
	}
	return &v, nil
}

// Bounds of a page of GET /vouchers: enough for a picker, small enough
// that one page is one cheap query and one Redis pipeline.
const (
	DefaultPage = 20
	MaxPage     = 100
)

// Page is one page of GET /vouchers: newest first. NextBefore is the
// cursor of the next page (its before), nil on the last page.
type Page struct {
	Vouchers   []View  `json:"vouchers"`
	NextBefore *string `json:"next_before"`
}

// List returns up to limit vouchers whose ID is below before (0: from the
// newest), newest first, each with its stock as Get reads it. Vouchers
// get their IDs from AUTO_INCREMENT, so a higher ID is a newer voucher,
// and a cursor on the ID, unlike an offset, neither skips nor repeats a
// voucher when others are created between two pages.
//
// One query and one Redis pipeline, whatever the page's size. A voucher
// whose keys Redis lost shows the stock column of the same row, as Get
// shows it.
func (s *Service) List(ctx context.Context, limit int, before int64) (Page, error) {
	if limit < 1 || limit > MaxPage {
		return Page{}, apperr.Invalid(fmt.Sprintf("limit must be between 1 and %d", MaxPage))
	}
	q := s.db.WithContext(ctx).Order("id DESC").Limit(limit + 1) // one more tells whether a next page exists
	if before > 0 {
		q = q.Where("id < ?", before)
	}
	var rows []Voucher
	if err := q.Find(&rows).Error; err != nil {
		return Page{}, apperr.Down(fmt.Errorf("list vouchers: %w", err))
	}
	page := Page{Vouchers: []View{}}
	if len(rows) > limit {
		rows = rows[:limit]
		next := strconv.FormatInt(rows[limit-1].ID, 10)
		page.NextBefore = &next
	}
	ids, parts := make([]int64, len(rows)), make([]int, len(rows))
	for i := range rows {
		ids[i], parts[i] = rows[i].ID, rows[i].Parts()
	}
	left, ok, err := s.stocks.LeftOf(ctx, ids, parts)
	if err != nil {
		return Page{}, apperr.Down(err)
	}
	for i := range rows {
		if !ok[i] {
			left[i] = rows[i].Stock
		}
		out, err := s.withRoom(ctx, &rows[i], rows[i].view(max(left[i], 0)))
		if err != nil {
			return Page{}, err
		}
		page.Vouchers = append(page.Vouchers, out)
	}
	return page, nil
}
