package room

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/apperr"
	"seckill/internal/stock"
)

// The scripts that answer a place begin with place.lua, the one home of
// how a place is read: a join answers the joiner's place in its own round
// trip.
var (
	//go:embed place.lua
	placeSrc string

	//go:embed join.lua
	joinSrc    string
	joinScript = redis.NewScript(placeSrc + joinSrc)

	//go:embed read.lua
	readSrc    string
	readScript = redis.NewScript(placeSrc + readSrc)

	//go:embed admit.lua
	admitSrc    string
	admitScript = redis.NewScript(admitSrc)
)

// The answers of the room, as the contract names them.
var (
	ErrNoRoom         = apperr.New(apperr.NotFound, "this voucher has no waiting room")
	ErrNotOpen        = apperr.New(apperr.NotStarted, "the waiting room has not opened yet")
	ErrEnded          = apperr.New(apperr.Ended, "the sale has ended")
	ErrSoldOut        = apperr.New(apperr.SoldOut, "sold out: no unit is left that is neither sold nor held")
	ErrAlreadyOrdered = apperr.New(apperr.AlreadyOrdered, "you already hold an order for this voucher")
	// ErrStockMissing: Redis lost the voucher's stock keys; the caller
	// reloads them (package order) and asks again.
	ErrStockMissing = errors.New("room: the voucher's stock keys are missing")
)

// Store keeps the rooms' lines in Redis. It is safe for concurrent use.
type Store struct {
	rdb   redis.UniversalClient
	joins joins // the joins waiting for a call (joins.go)
}

// NewStore returns a Store on rdb.
func NewStore(rdb redis.UniversalClient) *Store { return &Store{rdb: rdb} }

// keysOf are a voucher's room keys, in the order the scripts take them,
// all in the slot of the voucher's stock keys (stock.KeyOf), which the
// scripts read too.
func keysOf(voucherID int64) []string {
	k := stock.KeysOf(voucherID)
	return []string{
		stock.KeyOf(voucherID, "room:who"),
		stock.KeyOf(voucherID, "room:pre"),
		stock.KeyOf(voucherID, "room:late"),
		stock.KeyOf(voucherID, "room:state"),
		k.Admitted, k.Stock, k.Buyers,
		stock.KeyOf(voucherID, "room:joined"),
	}
}

// Join puts userID in sale's line, or leaves the place they hold. It
// reports whether the user joined now.
func (s *Store) Join(ctx context.Context, sale Sale, userID int64) (bool, error) {
	joined, _, err := s.JoinPlace(ctx, sale, userID)
	return joined, err
}

// JoinPlace is Join that also answers the user's place after it, read in
// the same script.
func (s *Store) JoinPlace(ctx context.Context, sale Sale, userID int64) (bool, Place, error) {
	v, err := s.join(ctx, sale, userID)
	if err != nil {
		return false, Place{}, apperr.Down(fmt.Errorf("join the room of voucher %d: %w", sale.VoucherID, err))
	}
	code, _ := v[len(v)-1].(int64) // a place's code comes after it
	if code == 0 || code == 1 {
		snap, err := snapshotOf(v[:len(v)-1])
		if err != nil {
			return false, Place{}, apperr.Down(fmt.Errorf("join the room of voucher %d: %w", sale.VoucherID, err))
		}
		return code == 0, snap.place(sale), nil
	}
	return false, Place{}, refusal(sale, code)
}

// refusal is the error of join.lua's code.
func refusal(sale Sale, code int64) error {
	switch code {
	case 2:
		return ErrNotOpen
	case 3:
		return ErrEnded
	case 4:
		return ErrSoldOut
	case 5:
		return ErrAlreadyOrdered
	case 6:
		return ErrStockMissing
	case 7:
		return apperr.Down(fmt.Errorf("join the room of voucher %d: Redis refused the write (full?)", sale.VoucherID))
	}
	return fmt.Errorf("join the room of voucher %d: unknown answer %d", sale.VoucherID, code)
}

// The states of a place, as the contract names them.
const (
	StateNone     = "none"
	StateWaiting  = "waiting"
	StateAdmitted = "admitted"
	StateExpired  = "expired"
	StateOrdered  = "ordered"
	StateSoldOut  = "sold_out"
)

// Place is a user's place in a room: GET /vouchers/{id}/room.
type Place struct {
	State   string  `json:"state"`
	Number  *string `json:"number"`
	Serving string  `json:"serving"`
	// Ahead: buyers with lower numbers still waiting.
	Ahead *int64 `json:"ahead"`
	// ETASeconds: the server's estimate of the wait until admission.
	ETASeconds    *int64     `json:"eta_seconds"`
	AdmittedUntil *time.Time `json:"admitted_until"`
}

// snapshot is place.lua's place.
type snapshot struct {
	state                string
	number               int64 // -1: not drawn yet
	serving, until, free int64
	total                int64
	now                  time.Time // Redis' clock
}

func (s *Store) read(ctx context.Context, sale Sale, userID string) (snapshot, error) {
	v, err := readScript.Run(ctx, s.rdb, keysOf(sale.VoucherID), userID, sale.Begin.UnixMilli()).Slice()
	if err == nil {
		var snap snapshot
		if snap, err = snapshotOf(v); err == nil {
			if snap.state == "missing" {
				return snapshot{}, ErrStockMissing
			}
			return snap, nil
		}
	}
	return snapshot{}, apperr.Down(fmt.Errorf("read the room of voucher %d: %w", sale.VoucherID, err))
}

func snapshotOf(v []any) (snapshot, error) {
	if len(v) != 7 {
		return snapshot{}, fmt.Errorf("a place of %d fields, not 7", len(v))
	}
	n := func(i int) int64 { x, _ := v[i].(int64); return x }
	state, _ := v[0].(string)
	return snapshot{state: state, number: n(1), serving: n(2), until: n(3), free: n(4), total: n(5), now: time.UnixMilli(n(6))}, nil
}

// Place reads userID's place in sale's room.
func (s *Store) Place(ctx context.Context, sale Sale, userID int64) (Place, error) {
	snap, err := s.read(ctx, sale, strconv.FormatInt(userID, 10))
	if err != nil {
		return Place{}, err
	}
	return snap.place(sale), nil
}

// place is the contract's view of a snapshot of one user.
func (snap snapshot) place(sale Sale) Place {
	p := Place{State: snap.state, Serving: strconv.FormatInt(snap.serving, 10)}
	if snap.number > 0 {
		n := strconv.FormatInt(snap.number, 10)
		p.Number = &n
	}
	if snap.until >= 0 && (snap.state == StateAdmitted || snap.state == StateExpired) {
		t := time.UnixMilli(snap.until).UTC()
		p.AdmittedUntil = &t
	}
	if snap.state != StateWaiting {
		return p
	}
	if snap.free <= 0 {
		p.State = StateSoldOut
	}
	if snap.number < 0 {
		return p // not drawn yet: neither its place nor its wait is known
	}
	ahead := max(snap.number-snap.serving-1, 0)
	p.Ahead = &ahead
	// Its turn comes after those ahead, at the room's rate, if there are
	// units for all of them; beyond, it waits for holds to end or orders
	// to be cancelled, which no one can foretell.
	if snap.free > ahead {
		eta := (ahead + int64(sale.AdmitPerSecond)) / int64(sale.AdmitPerSecond) // ceil((ahead+1)/rate)
		p.ETASeconds = &eta
	}
	return p
}

// View is a voucher's room in the voucher's JSON.
type View struct {
	OpensAt        time.Time `json:"opens_at"`
	AdmitPerSecond int       `json:"admit_per_second"`
	HoldFor        int       `json:"hold_for"`
	Commitment     string    `json:"commitment"`
	// Seed is given from begin_time on (null before).
	Seed    *string `json:"seed"`
	State   string  `json:"state"` // "open" or "sold_out"
	Serving string  `json:"serving"`
	Waiting int64   `json:"waiting"`
}

// Room states in View.
const (
	RoomOpen    = "open"
	RoomSoldOut = "sold_out"
)

// View reads sale's room as the voucher's JSON shows it. The seed is shown
// from begin_time on by Redis' clock, the one that closes the draw: by an
// instance's own, a clock running ahead would show the seed while joins
// still went into the draw, and whoever held many accounts could join
// only those that drew well.
func (s *Store) View(ctx context.Context, sale Sale) (View, error) {
	snap, err := s.read(ctx, sale, "")
	if err != nil {
		return View{}, err
	}
	return snap.view(sale), nil
}

// view is the room as a snapshot of its figures shows it.
func (snap snapshot) view(sale Sale) View {
	v := ConfigView(sale, snap.now)
	v.Serving = strconv.FormatInt(snap.serving, 10)
	v.Waiting = max(snap.total-snap.serving, 0)
	if snap.free <= 0 {
		v.State = RoomSoldOut
	}
	return v
}

// Line is View with the units the room's admitted buyers hold now (for
// the live page).
func (s *Store) Line(ctx context.Context, sale Sale) (View, int64, error) {
	snap, err := s.read(ctx, sale, "")
	if err != nil {
		return View{}, 0, err
	}
	v := snap.view(sale)
	left, err := s.rdb.Get(ctx, stock.KeysOf(sale.VoucherID).Stock).Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		return View{}, 0, apperr.Down(err)
	}
	return v, max(left-snap.free, 0), nil
}

// ConfigView is the part of a room's View that Redis is not asked for:
// what a voucher just created answers (nobody waits, nobody is served, and
// its units are all free, unless it has none), at now.
func ConfigView(sale Sale, now time.Time) View {
	v := View{OpensAt: sale.OpensAt.UTC(), AdmitPerSecond: sale.AdmitPerSecond, HoldFor: int(sale.HoldFor / time.Second),
		Commitment: Commitment(sale.Seed), State: RoomOpen, Serving: "0"}
	if sale.Stock <= 0 {
		v.State = RoomSoldOut
	}
	if !now.Before(sale.Begin) {
		seed := fmt.Sprintf("%x", sale.Seed)
		v.Seed = &seed
	}
	return v
}

// Admission is what one call of Admit did.
type Admission struct {
	Admitted, Serving, Free, Total int64
	// Ended: holds that ended without an order since the last call (of
	// any instance). Waits: how long each buyer admitted now waited.
	Ended int64
	Waits []time.Duration
}

// maxPerCall bounds one admit.lua: Redis runs nothing else meanwhile.
const maxPerCall = 2000

// Admit admits the next numbers of sale's room that its rate and its free
// units allow now; ErrStockMissing if Redis lost the voucher's stock keys.
func (s *Store) Admit(ctx context.Context, sale Sale) (Admission, error) {
	k := keysOf(sale.VoucherID)
	keys := []string{k[0], k[1], k[2], k[3], k[4], k[5], k[7]}
	v, err := admitScript.Run(ctx, s.rdb, keys, sale.Begin.UnixMilli(), sale.End.UnixMilli(),
		sale.AdmitPerSecond, sale.HoldFor.Milliseconds(), maxPerCall).Int64Slice()
	if err != nil {
		return Admission{}, fmt.Errorf("admit to the room of voucher %d: %w", sale.VoucherID, err)
	}
	if len(v) < 5 {
		return Admission{}, ErrStockMissing
	}
	a := Admission{Admitted: v[0], Serving: v[1], Free: v[2], Total: v[3], Ended: v[4]}
	for _, w := range v[5:] {
		a.Waits = append(a.Waits, time.Duration(w)*time.Millisecond)
	}
	return a, nil
}
