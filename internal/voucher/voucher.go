// Package voucher owns the things on sale: a voucher has a title, a stock
// and a sale window [begin_time, end_time).
//
// Creating a voucher writes its row to MySQL and its stock to Redis (package
// stock) before answering, so the first seckill request finds it ready. The
// seckill path asks Find for a voucher's window on every request; Find
// answers from memory (vouchers never change once created) so that a sale's
// hot path does not touch MySQL at all.
//
// GET /vouchers lists them a page at a time (Service.List): one query for
// the page, and one Redis pipeline for the stock of every voucher on it,
// so a page costs two round trips however long it is.
package voucher

import (
	"strconv"
	"time"

	"seckill/internal/apperr"
	"seckill/internal/room"
)

// Voucher is a row of vouchers.
type Voucher struct {
	ID           int64
	Title        string
	Stock        int64 // stock left in MySQL; the sellable figure is in Redis
	InitialStock int64
	BeginTime    time.Time
	EndTime      time.Time
	CreatedAt    time.Time
	// Buckets is how many parts the stock is split into in Redis, to
	// spread a hot voucher over a Redis Cluster's masters (package stock,
	// buckets.go). Left zero, the column's default, 1, is stored.
	Buckets int `gorm:"default:1"`
	// Price is what a buyer pays, in cents; PayWithin the seconds a buyer
	// has to pay, from the order (package order cancels an order unpaid by
	// then, and its unit goes back on sale).
	Price     int64
	PayWithin int `gorm:"default:900"`
	// The waiting room (package room), nil without one: when it opens,
	// how many buyers it admits a second, how long an admitted buyer
	// holds a unit (seconds), and the seed of its draw, chosen at
	// creation and shown from begin_time on.
	RoomOpensAt        *time.Time
	RoomAdmitPerSecond *int
	RoomHoldFor        *int
	RoomSeed           []byte
}

// HasRoom reports whether the voucher sells through a waiting room: what
// the buy button asks on every request, without building the room.
func (v *Voucher) HasRoom() bool { return v.RoomAdmitPerSecond != nil }

// Room is the voucher's waiting room as package room takes it; nil if it
// has none.
func (v *Voucher) Room() *room.Sale {
	if v.RoomAdmitPerSecond == nil || v.RoomOpensAt == nil || v.RoomHoldFor == nil || len(v.RoomSeed) != room.SeedSize {
		return nil
	}
	return &room.Sale{
		VoucherID: v.ID, Begin: v.BeginTime, End: v.EndTime, Stock: v.InitialStock, Seed: v.RoomSeed,
		Config: room.Config{OpensAt: *v.RoomOpensAt, AdmitPerSecond: *v.RoomAdmitPerSecond, HoldFor: time.Duration(*v.RoomHoldFor) * time.Second},
	}
}

// Parts is the voucher's bucket count as package stock takes it: at least 1.
func (v *Voucher) Parts() int { return max(v.Buckets, 1) }

// TableName is the contract's table name.
func (Voucher) TableName() string { return "vouchers" }

var (
	ErrNotFound   = apperr.New(apperr.NotFound, "no such voucher")
	ErrNotStarted = apperr.New(apperr.NotStarted, "the sale has not started yet")
	ErrEnded      = apperr.New(apperr.Ended, "the sale has ended")
	ErrDuplicate  = apperr.New(apperr.Busy, "this request was already submitted (same Idempotency-Key); wait for the first one")
)

// Open reports whether the sale window holds now: ErrNotStarted before
// begin_time, ErrEnded from end_time on.
func (v *Voucher) Open(now time.Time) error {
	switch {
	case now.Before(v.BeginTime):
		return ErrNotStarted
	case !now.Before(v.EndTime):
		return ErrEnded
	}
	return nil
}

// View is a voucher as the API shows it, with IDs as strings (JavaScript
// numbers cannot hold 63 bits) and stock the units still sellable.
type View struct {
	ID        string    `json:"id"`
	Title     string    `json:"title"`
	Stock     int64     `json:"stock"`
	BeginTime time.Time `json:"begin_time"`
	EndTime   time.Time `json:"end_time"`
	Buckets   int       `json:"buckets"`
	Price     int64     `json:"price"`
	PayWithin int       `json:"pay_within"`
	// Room is the voucher's waiting room, absent if it has none.
	Room *room.View `json:"room,omitempty"`
}

func (v *Voucher) view(stock int64) View {
	return View{
		ID:        strconv.FormatInt(v.ID, 10),
		Title:     v.Title,
		Stock:     stock,
		BeginTime: v.BeginTime.UTC(),
		EndTime:   v.EndTime.UTC(),
		Buckets:   v.Parts(),
		Price:     v.Price,
		PayWithin: v.PayWithin,
	}
}
