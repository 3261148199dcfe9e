package stock_test

import (
	"context"
	"testing"
	"time"

	"seckill/internal/stock"
	"seckill/internal/testenv"
)

// DropNotes tells a consumer that reads an entry again whether its dead
// letter was begun (its buyer forgotten: the entry must never be
// written), from the entry's note, or, for a dead letter a level-7
// instance began, from the mark user -> order ID its DropBuyer left
// alone. A replay's Undrop clears the mark, so the replayed order's new
// entry is written as any other.
//
// It fails if an entry begun by level 7 reads as not begun (the consumer
// writes it, and the buyer's next order is refused as a second one), or
// if a mark of another order, or one cleared for a replay, reads as
// begun (an order never dead-lettered would be).
func TestDropNotes(t *testing.T) {
	rdb := testenv.Redis(t, 0)
	s := stock.NewStore(rdb, time.Minute)
	ctx := context.Background()
	const n = 3
	id := newBucketed(t, rdb, s, 3, n)
	t.Cleanup(func() {
		for b := range n {
			rdb.Del(context.Background(), stock.BucketKeys(id, n, b).Dropped)
		}
	})
	users := usersAt(0, n, 5)
	const entry, later = "1700000000000-0", "1700000000001-0"
	level7 := func(user, order int64) { // 94b3afe's DropBuyer: the mark alone
		t.Helper()
		if err := rdb.HSet(ctx, stock.BucketKeys(id, n, 0).Dropped, user, order).Err(); err != nil {
			t.Fatal(err)
		}
	}
	drop := func(user, order int64, entry, note string) {
		t.Helper()
		if err := stock.DropBuyer(ctx, rdb, id, n, user, order, entry, note); err != nil {
			t.Fatal(err)
		}
	}

	// users[0]: nothing begun. users[1]: begun by level 8, with its note.
	// users[2]: begun by level 7. users[3]: level 7 dead-lettered another
	// order of theirs. users[4]: begun by level 8, then replayed under a
	// new entry (Undrop first).
	drop(users[1], 11, entry, "drop no stock left")
	level7(users[2], 12)
	level7(users[3], 99)
	drop(users[4], 14, entry, "back refused")
	if err := s.Undrop(ctx, id, n, users[4], 14); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name  string
		drop  stock.DropOf
		begun bool
		note  string
	}{
		{"never dead-lettered", stock.DropOf{User: users[0], Order: 10, Entry: entry}, false, ""},
		{"begun by level 8", stock.DropOf{User: users[1], Order: 11, Entry: entry}, true, "drop no stock left"},
		{"begun by level 7", stock.DropOf{User: users[2], Order: 12, Entry: entry}, true, ""},
		{"level 7's mark of another order", stock.DropOf{User: users[3], Order: 13, Entry: entry}, false, ""},
		{"the entry dead-lettered before a replay", stock.DropOf{User: users[4], Order: 14, Entry: entry}, true, "back refused"},
		{"the replayed entry", stock.DropOf{User: users[4], Order: 14, Entry: later}, false, ""},
	}
	drops := make([]stock.DropOf, len(tests))
	for i, tt := range tests {
		tt.drop.Voucher, tt.drop.Buckets = id, n
		drops[i] = tt.drop
	}
	notes, err := stock.DropNotes(ctx, rdb, drops) // all in one call, as a consumer asks
	if err != nil {
		t.Fatal(err)
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got, want := notes[i], (stock.DropNote{Begun: tt.begun, Note: tt.note}); got != want {
				t.Errorf("DropNotes = %+v, want %+v", got, want)
			}
		})
	}
}
