package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/glebarez/sqlite"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// voucherID is the one voucher every sale experiment sells.
const voucherID = 1

// schema is the lab's database: a voucher's stock, with a version column
// for optimistic locking and a fence column for fencing tokens, and the
// orders. The orders table has no unique index: the experiment that needs
// one adds it, so that the index shows up in its fixed variant.
var schema = []string{
	`CREATE TABLE vouchers (
		id      INTEGER PRIMARY KEY,
		stock   INTEGER NOT NULL,
		version INTEGER NOT NULL DEFAULT 0,
		fence   INTEGER NOT NULL DEFAULT 0
	)`,
	`CREATE TABLE orders (
		id         INTEGER PRIMARY KEY AUTOINCREMENT,
		user_id    INTEGER NOT NULL,
		voucher_id INTEGER NOT NULL
	)`,
}

// openDB opens a private in-memory SQLite database holding voucherID with
// stock units, after running extra statements (an index, say).
//
// The pool has one connection. SQLite runs one statement at a time anyway,
// and ":memory:" is private to its connection; what the experiments race
// over is the gap between two statements of one buyer, which stays open.
func openDB(ctx context.Context, stock int, extra ...string) (*gorm.DB, func(), error) {
	db, err := gorm.Open(sqlite.Open(":memory:"), &gorm.Config{
		Logger:         logger.Discard,
		TranslateError: true, // a unique index violation becomes gorm.ErrDuplicatedKey
	})
	if err != nil {
		return nil, nil, fmt.Errorf("open sqlite: %w", err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, nil, err
	}
	sqlDB.SetMaxOpenConns(1)
	closeDB := func() { _ = sqlDB.Close() }
	stmts := append(append([]string{}, schema...), extra...)
	for _, s := range stmts {
		if err := db.WithContext(ctx).Exec(s).Error; err != nil {
			closeDB()
			return nil, nil, fmt.Errorf("create schema: %w", err)
		}
	}
	if err := db.WithContext(ctx).Exec("INSERT INTO vouchers (id, stock) VALUES (?, ?)", voucherID, stock).Error; err != nil {
		closeDB()
		return nil, nil, fmt.Errorf("create voucher: %w", err)
	}
	return db, closeDB, nil
}

// countOrders returns how many orders user has for the voucher, or every
// order of the voucher when user is 0.
func countOrders(ctx context.Context, db *gorm.DB, user int64) (int, error) {
	var n int
	q := db.WithContext(ctx).Raw("SELECT COUNT(*) FROM orders WHERE voucher_id = ?", voucherID)
	if user != 0 {
		q = db.WithContext(ctx).Raw("SELECT COUNT(*) FROM orders WHERE voucher_id = ? AND user_id = ?", voucherID, user)
	}
	err := q.Scan(&n).Error
	return n, err
}

// stockLeft returns the voucher's stock.
func stockLeft(ctx context.Context, db *gorm.DB) (int, error) {
	var n int
	err := db.WithContext(ctx).Raw("SELECT stock FROM vouchers WHERE id = ?", voucherID).Scan(&n).Error
	return n, err
}

// openRedis starts an in-process Redis and a client for it. The server's
// clock stands still unless the lab moves it (srv.FastForward), so a key
// expires exactly when an experiment says so, however slow the machine.
func openRedis() (*miniredis.Miniredis, *redis.Client, func(), error) {
	srv, err := miniredis.Run()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("start miniredis: %w", err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	return srv, rdb, func() { _ = rdb.Close(); srv.Close() }, nil
}

// A handClock is the in-process Redis' clock as the lab moves it. forward
// moves every ttl on by d (miniredis' FastForward), and now says how far
// it has moved in all, for the timelines' time axis.
type handClock struct {
	srv   *miniredis.Miniredis
	moved time.Duration
}

func newHandClock(srv *miniredis.Miniredis) *handClock { return &handClock{srv: srv} }

func (c *handClock) forward(d time.Duration) {
	c.srv.FastForward(d)
	c.moved += d
}

func (c *handClock) now() time.Duration { return c.moved }

// race runs fn on n goroutines at once and returns when all have returned.
//
// Each call gets pause, the lab's hook. A goroutine that calls it waits
// there until every other goroutine has called it too, or has returned
// without calling it (it was turned away earlier). Put pause between a
// check and the act that trusts the check, and every goroutine checks
// before any acts: the worst interleaving, on every run, instead of the
// one the scheduler happens to pick.
func race(n int, fn func(i int, pause func())) {
	var (
		mu      sync.Mutex
		missing = n // goroutines that have neither paused nor returned
		open    = make(chan struct{})
		wg      sync.WaitGroup
	)
	arrive := func() {
		mu.Lock()
		defer mu.Unlock()
		if missing--; missing == 0 {
			close(open)
		}
	}
	for i := range n {
		wg.Go(func() {
			var once sync.Once
			defer once.Do(arrive) // returned without pausing: stop waiting for it
			fn(i, func() {
				once.Do(arrive)
				<-open
			})
		})
	}
	wg.Wait()
}

// randomID returns a random name, unique to whoever asked for it.
func randomID() string { return rand.Text() }

// A clock makes the in-process Redis' time follow the real one. Most lock
// experiments move Redis' clock by hand; the watchdog experiment cannot,
// since what it shows is a goroutine renewing the lock in real time.
type clock struct {
	srv      *miniredis.Miniredis
	advanced atomic.Int64 // nanoseconds moved since start
	stop     chan struct{}
	done     chan struct{}
}

// startClock starts moving srv's time forward, a millisecond at a time.
// Call close to stop it.
func startClock(srv *miniredis.Miniredis) *clock {
	c := &clock{srv: srv, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(c.done)
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		last := time.Now()
		for {
			select {
			case <-c.stop:
				return
			case <-t.C:
				now := time.Now()
				srv.FastForward(now.Sub(last))
				c.advanced.Add(int64(now.Sub(last)))
				last = now
			}
		}
	}()
	return c
}

// sleep returns once Redis' time has moved on by d, however late the
// ticks come on a busy machine: a key with a ttl below d, set before the
// call, has expired by then. It returns early with ctx's error.
func (c *clock) sleep(ctx context.Context, d time.Duration) error {
	until := c.advanced.Load() + int64(d)
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	for c.advanced.Load() < until {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// now says how far Redis' time has moved since the clock started.
func (c *clock) now() time.Duration { return time.Duration(c.advanced.Load()) }

func (c *clock) close() {
	close(c.stop)
	<-c.done
}
