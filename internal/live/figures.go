package live

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/order/queue"
	"seckill/internal/room"
	"seckill/internal/stock"
	"seckill/internal/voucher"
)

// Figures are what the page shows of a sale at one moment.
type Figures struct {
	At      time.Time `json:"at"`
	Voucher string    `json:"voucher"`
	Title   string    `json:"title"`
	Open    bool      `json:"open"`  // the sale window holds
	Ended   bool      `json:"ended"` // the sale window has passed: these are its last figures
	Initial int64     `json:"initial"`
	// RedisLeft is the units Redis will still sell (nil: its keys are
	// missing, until the next request reloads them).
	RedisLeft *int64 `json:"redis_left"`
	MySQLLeft int64  `json:"mysql_left"`
	// Orders are the orders that hold a unit: unpaid or paid.
	Orders int64 `json:"orders"`
	// Paid, Cancelled and Refunded count the orders in each state; the
	// units of the cancelled and refunded ones are back on sale.
	Paid      int64 `json:"paid"`
	Cancelled int64 `json:"cancelled"`
	Refunded  int64 `json:"refunded"`
	// Holds: MySQLLeft + Orders = Initial, read in one row. The orders
	// are counted in the voucher's row by the very UPDATEs that move its
	// stock (package order), so this holds unless something moved the
	// stock without counting: an instance of a version before the
	// counters, during an upgrade (migration 0005), or a bug. The tests
	// hold the counters to the orders' rows.
	Holds bool `json:"invariant_holds"`
	// PerSecond counts the answers of the last whole second, of every
	// instance, by outcome; Total since the sale's first answer.
	PerSecond map[string]int64 `json:"per_second"`
	Total     map[string]int64 `json:"total"`
	// P50MS and P99MS are the buy button's latency in the last whole
	// second, as the bound of the bucket they fall in (0: no answers).
	P50MS float64 `json:"p50_ms"`
	P99MS float64 `json:"p99_ms"`
	// Queue is async mode's orders not yet in MySQL (nil in sync mode):
	// entries not yet read plus read and not yet written, of all
	// vouchers.
	Queue *int64 `json:"queue"`
	// Room is the voucher's waiting room (package room), nil if it has
	// none.
	Room *RoomFigures `json:"room,omitempty"`
}

// RoomFigures are a waiting room's: as the voucher's JSON shows it, and
// the units its admitted buyers hold.
type RoomFigures struct {
	room.View
	Held int64 `json:"held"`
}

// Source reads a sale's figures.
type Source struct {
	db       *gorm.DB
	rdb      redis.UniversalClient
	rooms    *room.Store
	vouchers *voucher.Service
	stocks   *stock.Store
	queue    func(context.Context) (queue.Stats, error) // nil in sync mode
	now      func() time.Time
}

// NewSource returns a Source; queueStats is async mode's queue statistics, nil
// in sync mode.
func NewSource(db *gorm.DB, rdb redis.UniversalClient, vouchers *voucher.Service, stocks *stock.Store, queueStats func(context.Context) (queue.Stats, error), now func() time.Time) *Source {
	return &Source{db: db, rdb: rdb, rooms: room.NewStore(rdb), vouchers: vouchers, stocks: stocks, queue: queueStats, now: now}
}

// Read returns voucherID's figures now; the answers are those of the last
// whole second.
func (s *Source) Read(ctx context.Context, voucherID int64) (Figures, error) {
	v, err := s.vouchers.Find(ctx, voucherID)
	if err != nil {
		return Figures{}, err
	}
	now := s.now()
	f := Figures{At: now.UTC(), Voucher: strconv.FormatInt(voucherID, 10), Title: v.Title, Open: v.Open(now) == nil, Ended: !now.Before(v.EndTime), Initial: v.InitialStock}

	// One row, so one snapshot: the stock and the orders as of the same
	// moment, whatever commits meanwhile. The orders are not counted here
	// but read as counted: each column counts the orders that ever entered
	// a state, kept by the statements that move them (migration 0005). A
	// read is one row however many orders the sale has; counting them here
	// (a SUM over the voucher's voucher_orders) cost MariaDB 50 to 100 ms
	// per read on a sale of 300,000 orders.
	var sold, paid int64
	row := s.db.WithContext(ctx).Raw("SELECT stock, sold, paid, cancelled, refunded FROM vouchers WHERE id = ?", voucherID).Row()
	if err := row.Scan(&f.MySQLLeft, &sold, &paid, &f.Cancelled, &f.Refunded); err != nil {
		return Figures{}, fmt.Errorf("read the sale in MySQL: %w", err)
	}
	f.Orders = sold - f.Cancelled - f.Refunded // unpaid or paid: holding a unit
	f.Paid = paid - f.Refunded
	f.Holds = f.MySQLLeft+f.Orders == f.Initial

	if left, ok, err := s.stocks.Left(ctx, voucherID, v.Parts()); err != nil {
		return Figures{}, err
	} else if ok {
		left = max(left, 0)
		f.RedisLeft = &left
	}

	pipe := s.rdb.Pipeline()
	second := pipe.HGetAll(ctx, secondKey(voucherID, now.Unix()-1))
	total := pipe.HGetAll(ctx, totalKey(voucherID))
	if _, err := pipe.Exec(ctx); err != nil {
		return Figures{}, fmt.Errorf("read the answers: %w", err)
	}
	var lat [latencyBuckets]int64
	f.PerSecond, f.Total = map[string]int64{}, map[string]int64{}
	for field, val := range second.Val() {
		n, _ := strconv.ParseInt(val, 10, 64)
		if b, ok := strings.CutPrefix(field, "lat:"); ok {
			if i, err := strconv.Atoi(b); err == nil && i >= 0 && i < latencyBuckets {
				lat[i] += n
			}
			continue
		}
		f.PerSecond[field] = n
	}
	for field, val := range total.Val() {
		f.Total[field], _ = strconv.ParseInt(val, 10, 64)
	}
	f.P50MS, f.P99MS = percentile(lat, 0.50), percentile(lat, 0.99)

	if sale := v.Room(); sale != nil {
		line, held, err := s.rooms.Line(ctx, *sale)
		switch {
		case errors.Is(err, room.ErrStockMissing):
			// Redis lost the voucher's keys: no room figures until they
			// are back, and the rest of the page (MySQL against Redis) is
			// what the page is for meanwhile.
		case err != nil:
			return Figures{}, err
		default:
			f.Room = &RoomFigures{View: line, Held: held}
		}
	}
	if s.queue != nil {
		st, err := s.queue(ctx)
		if err != nil {
			return Figures{}, err
		}
		q := st.Lag + st.Pending
		f.Queue = &q
	}
	return f, nil
}

// percentile is the bound of the latency bucket where the p-th fraction of
// the answers falls; 0 when there are none.
func percentile(lat [latencyBuckets]int64, p float64) float64 {
	var total int64
	for _, n := range lat {
		total += n
	}
	if total == 0 {
		return 0
	}
	rank := int64(p*float64(total)+0.5) - 1 // 0-based rank of the p-th answer
	rank = max(rank, 0)
	var seen int64
	for i, n := range lat {
		seen += n
		if seen > rank {
			return boundMS(i)
		}
	}
	return boundMS(latencyBuckets - 1)
}

// crowdKey counts the simulated crowds' users ever handed out, by every
// instance that shares the Redis: the next crowd's users are the next
// numbers (Crowd.Start's reserve).
const crowdKey = "seckill:live:crowd:users"

// reserveCrowd hands out n crowd user numbers no crowd had before (until
// Redis forgets the count) and returns the first.
func (s *Source) reserveCrowd(ctx context.Context, n int) (int, error) {
	end, err := s.rdb.IncrBy(ctx, crowdKey, int64(n)).Result()
	if err != nil {
		return 0, err
	}
	return int((end - int64(n)) % crowdPhones), nil
}
