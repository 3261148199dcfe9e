// Command yardstick is the measure the server's order writes are held to:
// a bare Go loop that persists one order per transaction on one hot voucher
// row, the way the simplest correct seckill writes MySQL.
//
// It applies the project's migrations to the database (so the tables are
// the server's), inserts a voucher with stock -n, then runs -c goroutines
// on -c connections, each looping
//
//	BEGIN
//	UPDATE vouchers SET stock = stock - 1 WHERE id = ? AND stock > 0
//	INSERT INTO voucher_orders (id, user_id, voucher_id, status, created_at) VALUES (?, ?, ?, 'created', ?)
//	COMMIT
//
// until -n orders are committed, and prints orders per second. It uses
// database/sql and go-sql-driver/mysql with the DSN options the server
// forces (parseTime, loc=UTC) and the driver's defaults otherwise, as the
// server does.
//
//	go run ./loadtest/persist/yardstick -dsn 'root:@tcp(127.0.0.1:3306)/seckill_persist' -n 20000 -c 64
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"

	"seckill/migrations"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "yardstick:", err)
		os.Exit(1)
	}
}

func run() error {
	dsn := flag.String("dsn", "root:@tcp(127.0.0.1:3306)/seckill_persist", "go-sql-driver DSN of the database")
	n := flag.Int("n", 20000, "orders to write (and the voucher's stock)")
	conc := flag.Int("c", 64, "concurrent connections, one goroutine each")
	firstUser := flag.Int64("first-user", 1_000_000_000, "user IDs are first-user, first-user+1, ...")
	timeout := flag.Duration("timeout", 5*time.Minute, "give up after this long")
	flag.Parse()

	cfg, err := mysql.ParseDSN(*dsn)
	if err != nil {
		return err
	}
	cfg.ParseTime, cfg.Loc = true, time.UTC
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(*conc)
	db.SetMaxIdleConns(*conc)

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	if err := migrations.Apply(ctx, db, migrations.MySQL); err != nil {
		return err
	}
	now := time.Now().UTC()
	res, err := db.ExecContext(ctx, `INSERT INTO vouchers (title, stock, initial_stock, begin_time, end_time, created_at)
		VALUES ('yardstick', ?, ?, ?, ?, ?)`, *n, *n, now.Add(-time.Minute), now.Add(time.Hour), now)
	if err != nil {
		return fmt.Errorf("create voucher: %w", err)
	}
	voucherID, err := res.LastInsertId()
	if err != nil {
		return err
	}

	// Open every connection before the clock starts.
	conns := make([]*sql.Conn, *conc)
	for i := range conns {
		if conns[i], err = db.Conn(ctx); err != nil {
			return err
		}
	}
	for _, c := range conns {
		c.Close()
	}

	// Order IDs: unique in the table whatever ran before (time in the high
	// bits, a counter in the low ones), like the server's.
	idBase := time.Now().Unix() << 32
	var next atomic.Int64
	var soldOut atomic.Int64
	errc := make(chan error, *conc)
	var wg sync.WaitGroup
	start := time.Now()
	for range *conc {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(*n) {
					return
				}
				ok, err := order(ctx, db, voucherID, idBase+i, *firstUser+i)
				if err != nil {
					errc <- err
					cancel()
					return
				}
				if !ok {
					soldOut.Add(1)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	select {
	case err := <-errc:
		return err
	default:
	}

	var left, orders int64
	if err := db.QueryRow("SELECT stock FROM vouchers WHERE id = ?", voucherID).Scan(&left); err != nil {
		return err
	}
	if err := db.QueryRow("SELECT COUNT(*) FROM voucher_orders WHERE voucher_id = ?", voucherID).Scan(&orders); err != nil {
		return err
	}
	if left+orders != int64(*n) || orders != int64(*n)-soldOut.Load() {
		return fmt.Errorf("inconsistent: stock %d + orders %d != %d (sold out %d)", left, orders, *n, soldOut.Load())
	}
	fmt.Printf("RESULT kind=yardstick conns=%d orders=%d seconds=%.3f orders_per_s=%.0f\n",
		*conc, orders, elapsed.Seconds(), float64(orders)/elapsed.Seconds())
	return nil
}

// order writes one order in one transaction; false means sold out.
func order(ctx context.Context, db *sql.DB, voucherID, id, userID int64) (bool, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, "UPDATE vouchers SET stock = stock - 1 WHERE id = ? AND stock > 0", voucherID)
	if err != nil {
		return false, fmt.Errorf("update: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return false, err
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO voucher_orders (id, user_id, voucher_id, status, created_at) VALUES (?, ?, ?, 'created', ?)",
		id, userID, voucherID, time.Now().UTC()); err != nil {
		return false, fmt.Errorf("insert: %w", err)
	}
	if err := tx.Commit(); err != nil {
		if errors.Is(err, sql.ErrTxDone) {
			return false, ctx.Err()
		}
		return false, fmt.Errorf("commit: %w", err)
	}
	return true, nil
}
