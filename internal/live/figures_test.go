package live

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"seckill/internal/stock"
	"seckill/internal/testenv"
	"seckill/internal/voucher"
)

// A read of a sale's figures costs MySQL the same on a sale of 5,000
// orders as on a sale of none: it reads the voucher's row, where the
// orders are counted as they change (issue 35: a SUM over the orders cost
// 50 to 100 ms per read on a sale of 300,000). Measured as the rows InnoDB
// hands over (Handler_read_*) on the one connection of the pool.
func TestReadCostsTheSameHoweverManyOrders(t *testing.T) {
	ctx := context.Background()
	db := testenv.Open(t, testenv.MySQLDSN(t))
	sqlDB, _ := db.DB()
	sqlDB.SetMaxOpenConns(1) // every statement on one session, whose counters are read
	rdb := testenv.Redis(t, 0)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	stocks := stock.NewStore(rdb, 15*time.Second)
	vouchers := voucher.NewService(db, stocks, nil, nil, time.Now, log)
	src := NewSource(db, rdb, vouchers, stocks, nil, time.Now)
	create := func(title string, n int64) int64 {
		t.Helper()
		begin, end := time.Now().Add(-time.Minute), time.Now().Add(time.Hour)
		v, err := vouchers.Create(ctx, 0, "", voucher.CreateInput{Title: &title, Stock: &n, BeginTime: &begin, EndTime: &end})
		if err != nil {
			t.Fatal(err)
		}
		id, _ := strconv.ParseInt(v.ID, 10, 64)
		return id
	}
	const orders = 5000
	empty, big := create("no orders", 10), create("5,000 orders", orders)
	// The big sale's orders, paid, written straight into MySQL, and its
	// row as a sale leaves it: no stock, every order counted.
	for from := 0; from < orders; from += 1000 {
		var rows []string
		for i := from; i < from+1000; i++ {
			rows = append(rows, fmt.Sprintf("(%d, %d, %d, 'paid', NOW(3), 0, NOW(3), 0)", big*10_000+int64(i), i+1, big))
		}
		if err := db.Exec("INSERT INTO voucher_orders (id, user_id, voucher_id, status, created_at, amount, pay_by, bucket) VALUES " + strings.Join(rows, ", ")).Error; err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Exec("UPDATE vouchers SET stock = 0, sold = ?, paid = ? WHERE id = ?", orders, orders, big).Error; err != nil {
		t.Fatal(err)
	}

	handed := func() (n int64) {
		t.Helper()
		var rows []struct {
			VariableName string `gorm:"column:Variable_name"`
			Value        int64  `gorm:"column:Value"`
		}
		if err := db.Raw("SHOW SESSION STATUS LIKE 'Handler_read%'").Scan(&rows).Error; err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			n += r.Value
		}
		return n
	}
	cost := func(id int64) (Figures, int64) {
		t.Helper()
		before := handed()
		f, err := src.Read(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return f, handed() - before
	}
	cost(empty) // the vouchers' metadata, read once and kept (voucher.Service.Find)
	cost(big)
	_, small := cost(empty)
	f, large := cost(big)
	if f.Orders != orders || f.Paid != orders || f.MySQLLeft != 0 || !f.Holds {
		t.Errorf("the big sale's figures: %+v, want %d orders, all paid, none left, the invariant holding", f, orders)
	}
	if large > small+5 {
		t.Errorf("a read of a sale of %d orders had InnoDB hand over %d rows, of a sale of none %d: the read grows with the orders", orders, large, small)
	}
	t.Logf("rows handed over by a read: %d (no orders), %d (%d orders)", small, large, orders)
}
