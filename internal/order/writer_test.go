package order

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"seckill/internal/testenv"
)

// A batch that fails as a whole (one of its users already has an order)
// is handed back to its requests, each to write its own order alone: the
// writer does not write them one by one itself, where every other order of
// the instance would wait behind them. Each request then gets its own
// answer: the user with an order is refused, the others are written.
func TestFailedBatchIsWrittenByItsRequests(t *testing.T) {
	db := testenv.Open(t, testenv.MySQLDSN(t))
	vid := testenv.ID() % 1_000_000_000
	if err := db.Exec("INSERT INTO vouchers (id, title, stock, initial_stock, begin_time, end_time, created_at) VALUES (?, 't', 10, 10, NOW(), NOW() + INTERVAL 1 HOUR, NOW())", vid).Error; err != nil {
		t.Fatal(err)
	}
	at := time.Now().UTC().Truncate(time.Millisecond)
	order := func(id, user int64) *Order {
		return &Order{ID: id, UserID: user, VoucherID: vid, Status: StatusUnpaid, CreatedAt: at}
	}
	if err := db.Create(order(2000, 2)).Error; err != nil { // user 2 has an order already
		t.Fatal(err)
	}
	s := NewService(db, nil, nil, nil, nil, nil, time.Now, slog.New(slog.NewTextHandler(io.Discard, nil)), Config{WriteTimeout: 5 * time.Second, GroupCommit: 100})

	var batch []*write
	for user := int64(1); user <= 4; user++ {
		batch = append(batch, &write{ctx: context.Background(), order: order(2000+user*10, user), done: make(chan written, 1)})
	}
	s.commits.writeGroup(batch)
	for _, w := range batch {
		if r := <-w.done; !r.alone {
			t.Fatalf("user %d: the writer answered %+v, want its request to write alone", w.order.UserID, r)
		}
	}
	for _, w := range batch {
		r := s.commits.writeAlone(w)
		switch {
		case w.order.UserID == 2 && (r.outcome != NotWritten || !errors.Is(r.err, ErrAlreadyOrdered)):
			t.Errorf("user 2, who has an order: %v %v, want not written, already ordered", r.outcome, r.err)
		case w.order.UserID != 2 && r.outcome != Written:
			t.Errorf("user %d: %v %v, want written", w.order.UserID, r.outcome, r.err)
		}
	}
	var rows, stock int64
	db.Raw("SELECT COUNT(*) FROM voucher_orders WHERE voucher_id = ?", vid).Scan(&rows)
	db.Raw("SELECT stock FROM vouchers WHERE id = ?", vid).Scan(&stock)
	if rows != 4 || stock != 7 {
		t.Fatalf("%d rows, stock %d; want 4 (3 new) and 7", rows, stock)
	}
}
