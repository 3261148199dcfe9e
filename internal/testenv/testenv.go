// Package testenv gives tests the real MySQL and Redis, and servers of
// their own.
//
// A test that needs nothing but Go (miniredis, SQLite, a handler driven
// with httptest) is a unit test and always runs. Every other test is an
// integration test, and the variables below say whether it runs:
//
//   - SECKILL_TEST_MYSQL_DSN (a go-sql-driver DSN; its database name is
//     ignored: every call makes a fresh database and drops it afterwards)
//     and SECKILL_TEST_REDIS_ADDR name the shared servers. A test that
//     needs one is skipped, naming the variable, when it is not set.
//   - SECKILL_INTEGRATION=1, or either address set, also runs the tests
//     that start processes of their own: redis-server, mariadbd, etcd,
//     ZooKeeper, Redis Cluster and Sentinel, headless Chromium. Without
//     it they are skipped, naming the variable, even where the binaries
//     are installed: starting them is what made a plain `go test ./...`
//     take minutes.
//   - SECKILL_REQUIRE_INTEGRATION=1 turns every such skip into a failure:
//     CI sets it with both addresses, so a missing server or binary can
//     never turn into a green run.
//
// The shared servers serve every package's tests at once. A test that kills
// a server, restarts it or makes it read-only starts one of its own
// instead: StartMariaDB and StartRedis (servers.go). Package faultproxy
// puts a proxy between a client and either kind of server, to cut, stall,
// slow or half-answer the connections while a sale runs.
package testenv

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"seckill/migrations"
)

// Enabled reports whether this run includes integration tests: with
// SECKILL_INTEGRATION=1 or SECKILL_REQUIRE_INTEGRATION=1, or when a shared
// server's address is set (whoever names a server means to test against
// it).
func Enabled() bool {
	return os.Getenv("SECKILL_INTEGRATION") == "1" || Required() ||
		os.Getenv("SECKILL_TEST_MYSQL_DSN") != "" || os.Getenv("SECKILL_TEST_REDIS_ADDR") != ""
}

// Required reports whether SECKILL_REQUIRE_INTEGRATION=1: a test that
// cannot get what it needs then fails instead of skipping.
func Required() bool { return os.Getenv("SECKILL_REQUIRE_INTEGRATION") == "1" }

// Integration skips t unless Enabled. what names the process t would
// start ("redis-server"), so that the skip says what was left out and
// which variable brings it back. Every Start function calls it first;
// tests that start a process without them call it themselves.
func Integration(t testing.TB, what string) {
	t.Helper()
	if !Enabled() {
		t.Skipf("integration test (starts %s): set SECKILL_INTEGRATION=1 to run it", what)
	}
}

// need returns the variable's value, or skips or fails the test without it.
func need(t testing.TB, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		unavailable(t, name+" is not set")
	}
	return v
}

// unavailable skips t because what it needs is missing, or fails it when
// SECKILL_REQUIRE_INTEGRATION=1.
func unavailable(t testing.TB, missing string) {
	t.Helper()
	if Required() {
		t.Fatalf("%s and SECKILL_REQUIRE_INTEGRATION=1", missing)
	}
	t.Skipf("%s; skipping integration test", missing)
}

// RedisAddr returns the test Redis' address.
func RedisAddr(t testing.TB) string {
	t.Helper()
	return need(t, "SECKILL_TEST_REDIS_ADDR")
}

// Redis returns a client of the test Redis on logical database db. Tests
// share that Redis with other packages running at the same time: use keys
// of your own, and flush only a database no other test uses. The
// databases tests flush, by package (within one package tests run one
// after another, so they may share one):
//
//	0        nobody flushes it: every package's keys of their own
//	1        internal/auth (sessions)
//	2-4, 8-14  cmd/server (newStack, the rolling upgrade, metrics, faults)
//	5        internal/fleet
//	6        cmd/server (versions)
//	7        internal/order (async buckets)
//	15       internal/order/queue
func Redis(t testing.TB, db int) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: RedisAddr(t), DB: db})
	t.Cleanup(func() { rdb.Close() })
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("redis at %s: %v", rdb.Options().Addr, err)
	}
	return rdb
}

// EmptyMySQLDSN creates a fresh, empty database and returns a DSN for it
// (parseTime=true, loc=UTC). The database is dropped when the test ends.
func EmptyMySQLDSN(t testing.TB) string {
	t.Helper()
	cfg, err := mysql.ParseDSN(need(t, "SECKILL_TEST_MYSQL_DSN"))
	if err != nil {
		t.Fatalf("SECKILL_TEST_MYSQL_DSN: %v", err)
	}
	cfg.ParseTime, cfg.Loc, cfg.DBName = true, time.UTC, ""
	admin, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	b := make([]byte, 6)
	rand.Read(b)
	name := "seckill_t_" + hex.EncodeToString(b)
	if _, err := admin.ExecContext(context.Background(), "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		db, err := sql.Open("mysql", cfg.FormatDSN())
		if err == nil {
			db.Exec("DROP DATABASE IF EXISTS " + name)
			db.Close()
		}
	})
	cfg.DBName = name
	return cfg.FormatDSN()
}

// MySQLDSN creates a fresh, migrated database and returns a DSN for it
// (parseTime=true, loc=UTC). The database is dropped when the test ends.
func MySQLDSN(t testing.TB) string {
	t.Helper()
	dsn := EmptyMySQLDSN(t)
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if err := migrations.Apply(ctx, db, migrations.MySQL); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	// Tests share one Redis, where keys carry voucher IDs: start each
	// database's IDs somewhere else so that two tests never meet.
	if _, err := db.ExecContext(ctx, fmt.Sprintf("ALTER TABLE vouchers AUTO_INCREMENT = %d", ID()%1_000_000_000_000+1_000_000)); err != nil {
		t.Fatalf("offset voucher IDs: %v", err)
	}
	return dsn
}

// Open opens dsn with the server's gorm settings and a small pool.
func Open(t testing.TB, dsn string) *gorm.DB {
	t.Helper()
	db, err := gorm.Open(gormmysql.Open(dsn), &gorm.Config{TranslateError: true, SkipDefaultTransaction: true, Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	sqlDB, _ := db.DB()
	sqlDB.SetMaxOpenConns(10)
	t.Cleanup(func() { sqlDB.Close() })
	return db
}

// ID returns a random positive ID, for keys no other test uses.
func ID() int64 {
	b := make([]byte, 8)
	rand.Read(b)
	var n int64
	for _, x := range b {
		n = n<<8 | int64(x)
	}
	if n < 0 {
		n = -n
	}
	return n>>8 + 1
}

// Name returns a random name with prefix, for keys no other test uses.
func Name(prefix string) string { return fmt.Sprintf("%s%d", prefix, ID()) }
