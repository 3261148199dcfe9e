package migrations_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"seckill/migrations"
)

// The counters' migration (0005) counts the orders already there, in both
// dialects; on MySQL it does so without locking them: an order an old
// instance is writing while it runs (its transaction still open) does not
// hold it up, as it would under REPEATABLE READ, and is not counted (that
// instance does not count it either: see the file).
func TestVoucherCountsMigration(t *testing.T) {
	open := map[string]func(*testing.T) *sql.DB{migrations.SQLite: migratedSQLite, migrations.MySQL: openMySQL}
	for _, dialect := range []string{migrations.SQLite, migrations.MySQL} {
		t.Run(dialect, func(t *testing.T) {
			ctx := context.Background()
			db := open[dialect](t)
			exec := func(q string, args ...any) {
				t.Helper()
				if _, err := db.ExecContext(ctx, q, args...); err != nil {
					t.Fatal(err)
				}
			}
			for _, id := range []int{1, 2, 3} {
				exec(`INSERT INTO vouchers (id, title, stock, initial_stock, begin_time, end_time, created_at)
					VALUES (?, 't', 10, 10, '2024-01-01 00:00:00', '2024-01-02 00:00:00', '2024-01-01 00:00:00')`, id)
			}
			order := 0
			for voucher, statuses := range map[int][]string{
				1: {"created", "unpaid", "unpaid", "paid", "paid", "cancelled", "refunded"},
				3: {"cancelled"},
			} {
				for _, s := range statuses {
					order++
					exec("INSERT INTO voucher_orders (id, user_id, voucher_id, status, created_at) VALUES (?, ?, ?, ?, '2024-01-01 00:00:00')", order, order, voucher, s)
				}
			}
			conn, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if dialect == migrations.MySQL {
				// An old instance's order, its transaction open.
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback()
				if _, err := tx.ExecContext(ctx, "INSERT INTO voucher_orders (id, user_id, voucher_id, status, created_at) VALUES (100, 100, 1, 'created', '2024-01-01 00:00:00')"); err != nil {
					t.Fatal(err)
				}
				if _, err := conn.ExecContext(ctx, "SET SESSION innodb_lock_wait_timeout = 1"); err != nil {
					t.Fatal(err)
				}
			}
			src, err := os.ReadFile(filepath.Join(dialect, "0005_voucher_counts.sql"))
			if err != nil {
				t.Fatal(err)
			}
			for _, stmt := range migrations.Statements(string(src)) {
				if strings.HasPrefix(stmt, "ALTER TABLE") {
					continue // applied already, with the rest: the counts run again
				}
				if _, err := conn.ExecContext(ctx, stmt); err != nil {
					t.Fatalf("%.60s...: %v", stmt, err)
				}
			}
			want := map[int][4]int64{1: {7, 3, 1, 1}, 2: {}, 3: {1, 0, 1, 0}}
			for id, w := range want {
				var got [4]int64
				if err := conn.QueryRowContext(ctx, "SELECT sold, paid, cancelled, refunded FROM vouchers WHERE id = ?", id).Scan(&got[0], &got[1], &got[2], &got[3]); err != nil {
					t.Fatal(err)
				}
				if got != w {
					t.Errorf("voucher %d: sold, paid, cancelled, refunded %v, want %v", id, got, w)
				}
			}
			if dialect == migrations.MySQL {
				var iso string
				conn.QueryRowContext(ctx, "SELECT @@tx_isolation").Scan(&iso)
				if iso != "REPEATABLE-READ" {
					t.Errorf("the session's isolation after the migration: %s, want REPEATABLE-READ (READ COMMITTED was for one statement)", iso)
				}
			}
		})
	}
}
