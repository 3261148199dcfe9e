package lock

import (
	"context"
	"database/sql"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"seckill/internal/testenv/faultproxy"
)

// testMySQL returns a pool on the server at SECKILL_TEST_MYSQL_DSN. Named
// locks need no database, so the DSN's is dropped. The pool is capped: each
// waiter and holder takes a connection, and the server is shared.
func testMySQL(t testing.TB) *sql.DB { return testMySQLPool(t, 20) }

// testMySQLPool is a pool of its own on SECKILL_TEST_MYSQL_DSN (no
// database: GET_LOCK needs none) of at most conns connections.
func testMySQLPool(t testing.TB, conns int) *sql.DB {
	t.Helper()
	dsn := os.Getenv("SECKILL_TEST_MYSQL_DSN")
	if dsn == "" {
		integration(t, "SECKILL_TEST_MYSQL_DSN is not set")
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DBName = ""
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(conns)
	t.Cleanup(func() { db.Close() })
	if err := db.PingContext(context.Background()); err != nil {
		t.Fatalf("mysql: %v", err)
	}
	return db
}

func TestMySQL(t *testing.T) {
	db := testMySQL(t)
	// The thief has a connection of its own: stealing must not wait for
	// the pool the holders use.
	admin := testMySQL(t)
	testConformance(t, backend{
		locker: NewMySQL(db),
		ttl:    300 * time.Millisecond,
		// A server shared with other packages' tests, slow under load.
		watchTTL: time.Second,
		newKey:   func(t *testing.T) string { return testKey(t) },
		steal: func(t *testing.T, key string) {
			// As a failover or an operator would: end the holder's session.
			ctx := context.Background()
			var id sql.NullInt64
			if err := admin.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?)", mysqlName(key)).Scan(&id); err != nil {
				t.Fatal(err)
			}
			if !id.Valid {
				t.Fatalf("lock %q is not held", key)
			}
			if _, err := admin.ExecContext(ctx, "KILL ?", id.Int64); err != nil {
				t.Fatal(err)
			}
			// KILL returns before the session has gone and freed its locks.
			for deadline := time.Now().Add(5 * time.Second); ; {
				var used sql.NullInt64
				if err := admin.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?)", mysqlName(key)).Scan(&used); err != nil {
					t.Fatal(err)
				}
				if !used.Valid || used.Int64 != id.Int64 || time.Now().After(deadline) {
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		},
	})
}

// TestMySQLHolderDies checks a crashed holder's lock is free at once: its
// connections are reset, and the server ends its session and frees its
// locks, long before the holder's ttl would run out.
func TestMySQLHolderDies(t *testing.T) {
	ctx := context.Background()
	m := NewMySQL(testMySQL(t))
	key := testKey(t)

	cfg, err := mysql.ParseDSN(os.Getenv("SECKILL_TEST_MYSQL_DSN"))
	if err != nil {
		t.Fatal(err)
	}
	proxy := faultproxy.Start(t, cfg.Addr)
	cfg.Addr, cfg.DBName = proxy.Addr(), ""
	crashed, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer crashed.Close()
	dead, err := NewMySQL(crashed).Obtain(ctx, key, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Obtain(ctx, key, time.Second); err != ErrNotAcquired {
		t.Fatalf("Obtain while held: got %v, want ErrNotAcquired", err)
	}
	proxy.Cut() // the holder's process dies: the kernel resets its sockets

	died := time.Now()
	lk, err := m.Obtain(waitCtx(t, 5*time.Second), key, time.Second, Wait())
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(died); d > time.Second {
		t.Errorf("obtained %v after the holder died, its ttl 30s", d)
	}
	mustRelease(t, lk)
	// Had the holder lived on, its lock would have told it.
	if err := dead.Release(ctx); err != ErrNotHeld {
		t.Errorf("Release by the dead holder: got %v, want ErrNotHeld", err)
	}
}

// A server may compare lock names without regard to case; keys that
// differ only in case must still be two locks, as on every other backend.
// The names must differ even to such a server (the test's own MariaDB
// tells cases apart, so the first check is the one that can fail here).
func TestMySQLKeysDifferingInCase(t *testing.T) {
	for _, k := range [][2]string{{"order:1", "Order:1"}, {"a", "A"}, {"user:ß", "user:SS"}} {
		if a, b := mysqlName(k[0]), mysqlName(k[1]); strings.EqualFold(a, b) {
			t.Errorf("keys %q and %q get names %q and %q, one lock to a server that ignores case", k[0], k[1], a, b)
		}
	}
	m := NewMySQL(testMySQL(t))
	key := testKey(t)
	lower := mustObtain(t, m, key+":order", 10*time.Second)
	defer mustRelease(t, lower)
	upper, err := m.Obtain(context.Background(), key+":ORDER", 10*time.Second)
	if err != nil {
		t.Fatalf("a key differing only in case: %v, want a lock of its own", err)
	}
	mustRelease(t, upper)
	if got := mysqlName(key + ":order"); got != "lock:"+key+":order" {
		t.Errorf("a lower-case key's name %q, want it readable", got)
	}
}
