package testenv_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"

	"seckill/internal/testenv"
)

func TestMain(m *testing.M) {
	// A server's waiter goroutine ends with its process: none may be left.
	testenv.Main(m)
}

// erOptionPreventsStatement is MySQL's error 1290, which a write gets from
// a read-only server.
const erOptionPreventsStatement = 1290

func TestMariaDBReadOnly(t *testing.T) {
	m := testenv.StartMariaDB(t)
	dsn := m.CreateUser(t, "shop", "shop")
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	ctx := context.Background()
	mustExec(t, db, "CREATE TABLE orders (id BIGINT PRIMARY KEY)")
	mustExec(t, db, "INSERT INTO orders VALUES (1)")

	m.SetReadOnly(t, true)
	_, err = db.ExecContext(ctx, "INSERT INTO orders VALUES (2)")
	var myErr *mysql.MySQLError
	if !errors.As(err, &myErr) || myErr.Number != erOptionPreventsStatement {
		t.Fatalf("insert while read-only: got %v, want MySQL error %d", err, erOptionPreventsStatement)
	}
	// root bypasses read_only; the service's user must not.
	m.Exec(t, "INSERT INTO shop.orders VALUES (3)")

	m.SetReadOnly(t, false)
	mustExec(t, db, "INSERT INTO orders VALUES (2)")
	if n := count(t, db); n != 3 {
		t.Fatalf("orders: got %d rows, want 3", n)
	}

	// The rows were committed: they survive a crash.
	m.Kill()
	if err := db.PingContext(ctx); err == nil {
		t.Fatal("ping of a killed server succeeded")
	}
	m.Restart(t)
	if n := count(t, db); n != 3 {
		t.Fatalf("orders after restart: got %d rows, want 3", n)
	}
}

func TestRedisKillRestart(t *testing.T) {
	s := testenv.StartRedis(t)
	rdb := s.Client(t)
	ctx := context.Background()
	if err := rdb.Set(ctx, "stock", 10, 0).Err(); err != nil {
		t.Fatal(err)
	}

	s.Kill()
	if err := rdb.Get(ctx, "stock").Err(); err == nil || errors.Is(err, redis.Nil) {
		t.Fatalf("GET from a killed server: got %v, want a network error", err)
	}

	// Same address, nothing saved: the cache comes back empty.
	s.Restart(t)
	if err := rdb.Get(ctx, "stock").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET after restart: got %v, want redis.Nil", err)
	}
}

func mustExec(t *testing.T, db *sql.DB, query string) {
	t.Helper()
	if _, err := db.ExecContext(context.Background(), query); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

func count(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(context.Background(), "SELECT COUNT(*) FROM orders").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
