package order

import (
	"context"
	"errors"
	"testing"
	"time"

	"gorm.io/gorm"

	"seckill/internal/testenv"
)

// Two orders with one ID in one batch (Redis lost the day's sequence and
// gave an ID out twice) are a collision, as they would be one INSERT at a
// time: not one row and two answers of 200. The same order twice (an entry
// delivered twice) is one row.
func TestWriteBatchTellsCollisionFromRedelivery(t *testing.T) {
	db := testenv.Open(t, testenv.MySQLDSN(t))
	ctx := context.Background()
	vid := tenUnits(t, db)
	at := time.Now().UTC().Truncate(time.Millisecond)
	a := Order{ID: 1001, UserID: 1, VoucherID: vid, Status: StatusUnpaid, CreatedAt: at}
	b := Order{ID: 1001, UserID: 2, VoucherID: vid, Status: StatusUnpaid, CreatedAt: at}

	outcome, err := transact(ctx, db, func(tx *gorm.DB) error { return writeBatch(tx, []Order{a, b}) })
	if outcome != NotWritten || !errors.Is(err, errIDCollision) {
		t.Fatalf("one ID for two orders: %v, %v; want not written, an ID collision", outcome, err)
	}
	outcome, err = transact(ctx, db, func(tx *gorm.DB) error { return writeBatch(tx, []Order{a, a}) })
	if outcome != Written || err != nil {
		t.Fatalf("one order twice: %v, %v; want written", outcome, err)
	}
	var rows, stock int64
	db.Raw("SELECT COUNT(*) FROM voucher_orders WHERE voucher_id = ?", vid).Scan(&rows)
	db.Raw("SELECT stock FROM vouchers WHERE id = ?", vid).Scan(&stock)
	if rows != 1 || stock != 9 {
		t.Fatalf("%d rows, stock %d; want 1 and 9", rows, stock)
	}
}

// A batch is inserted without first looking for its orders; one that
// meets orders already written (a redelivery after its consumer died,
// here with a new order among them) must insert only the new ones, take
// only their units, and still tell an ID that another order owns. The
// failed INSERT undoes itself only: the transaction goes on to write the
// rest.
func TestWriteBatchRedelivered(t *testing.T) {
	db := testenv.Open(t, testenv.MySQLDSN(t))
	ctx := context.Background()
	vid := tenUnits(t, db)
	at := time.Now().UTC().Truncate(time.Millisecond)
	base := testenv.ID()
	order := func(i, user int64) Order {
		return Order{ID: base + i, UserID: user, VoucherID: vid, Status: StatusUnpaid, CreatedAt: at}
	}
	write := func(batch ...Order) (Outcome, error) {
		return transact(ctx, db, func(tx *gorm.DB) error { return writeBatch(tx, batch) })
	}
	check := func(wantRows, wantStock int64) {
		t.Helper()
		var rows, stock int64
		db.Raw("SELECT COUNT(*) FROM voucher_orders WHERE voucher_id = ?", vid).Scan(&rows)
		db.Raw("SELECT stock FROM vouchers WHERE id = ?", vid).Scan(&stock)
		if rows != wantRows || stock != wantStock {
			t.Fatalf("%d rows, stock %d; want %d and %d", rows, stock, wantRows, wantStock)
		}
	}

	if outcome, err := write(order(1, 1), order(2, 2)); outcome != Written || err != nil {
		t.Fatalf("a new batch: %v, %v", outcome, err)
	}
	check(2, 8)
	if outcome, err := write(order(1, 1), order(2, 2), order(3, 3)); outcome != Written || err != nil {
		t.Fatalf("two written before and one new: %v, %v; want written", outcome, err)
	}
	check(3, 7)
	if outcome, err := write(order(2, 2)); outcome != Written || err != nil {
		t.Fatalf("one written before: %v, %v; want written", outcome, err)
	}
	check(3, 7)
	// The new order first: had the failed INSERT kept its row, the look
	// would count it as written before and never take its unit.
	if outcome, err := write(order(5, 5), order(2, 2)); outcome != Written || err != nil {
		t.Fatalf("one new before one written: %v, %v; want written", outcome, err)
	}
	check(4, 6)
	if outcome, err := write(order(4, 4), order(1, 9)); outcome != NotWritten || !errors.Is(err, errIDCollision) {
		t.Fatalf("an ID another order owns: %v, %v; want not written, an ID collision", outcome, err)
	}
	check(4, 6)
}

// An order committed by another writer after this transaction's first read
// is invisible to a plain read in it (REPEATABLE READ); the INSERT that
// hits it must still be told "the same order, written meanwhile", not "ID
// taken", which the consumer would take for MySQL being down.
func TestDuplicateSeesRowCommittedMeanwhile(t *testing.T) {
	db := testenv.Open(t, testenv.MySQLDSN(t))
	vid := tenUnits(t, db)
	o := Order{ID: testenv.ID(), UserID: 1, VoucherID: vid, Status: StatusUnpaid, CreatedAt: time.Now().UTC().Truncate(time.Millisecond)}
	tx := db.Begin()
	defer tx.Rollback()
	var n int64
	if err := tx.Raw("SELECT COUNT(*) FROM voucher_orders WHERE voucher_id = ?", vid).Scan(&n).Error; err != nil { // the snapshot
		t.Fatal(err)
	}
	if err := db.Create(&o).Error; err != nil { // another writer, committed
		t.Fatal(err)
	}
	if err := tx.Create(&o).Error; !errors.Is(err, gorm.ErrDuplicatedKey) {
		t.Fatalf("insert: %v; want a duplicate key", err)
	}
	if err := keyHit(tx, &o); !errors.Is(err, errWrittenMeanwhile) {
		t.Fatalf("keyHit: %v; want written meanwhile", err)
	}
}

// tenUnits makes a voucher of 10 units on sale, straight in MySQL, and
// returns its ID.
func tenUnits(t *testing.T, db *gorm.DB) int64 {
	t.Helper()
	vid := testenv.ID() % 1_000_000_000
	if err := db.Exec("INSERT INTO vouchers (id, title, stock, initial_stock, begin_time, end_time, created_at) VALUES (?, 't', 10, 10, NOW(), NOW() + INTERVAL 1 HOUR, NOW())", vid).Error; err != nil {
		t.Fatal(err)
	}
	return vid
}
