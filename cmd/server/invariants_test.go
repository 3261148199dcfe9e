package main

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/stock"
)

// outcome is one seckill answer.
type outcome struct {
	User    string
	Status  int
	Code    string
	OrderID string
	Err     error
}

// ledger collects outcomes from many goroutines.
type ledger struct {
	mu  sync.Mutex
	all []outcome
}

func (l *ledger) add(o outcome) {
	l.mu.Lock()
	l.all = append(l.all, o)
	l.mu.Unlock()
}

// wins returns user -> order ID for every 200, failing if a user won twice.
func (l *ledger) wins(t *testing.T) map[string]string {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	won := map[string]string{}
	for _, o := range l.all {
		if o.Status != http.StatusOK {
			continue
		}
		if prev, ok := won[o.User]; ok {
			t.Errorf("user %s got two 200s: orders %s and %s", o.User, prev, o.OrderID)
		}
		won[o.User] = o.OrderID
	}
	return won
}

// count returns how many outcomes had the status and code.
func (l *ledger) count(status int, code string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, o := range l.all {
		if o.Status == status && o.Code == code {
			n++
		}
	}
	return n
}

// buy sends one seckill request and records its outcome.
func buy(l *ledger, base string, u user, voucherID string) outcome {
	r, err := call("POST", base+"/seckill/"+voucherID, u.Token, nil)
	o := outcome{User: u.ID, Status: r.Status, Code: r.Code(), OrderID: r.Str("order_id"), Err: err}
	l.add(o)
	return o
}

// storeState is what MySQL and Redis hold for a voucher.
type storeState struct {
	Stock       int64            // vouchers.stock
	Orders      map[string]int64 // order ID -> user ID
	Users       map[int64]int    // user ID -> orders
	RedisStock  int64
	RedisExists bool
	RedisErr    error // why the stock could not be read, other than its absence
	Holds       int64
	Buckets     int // vouchers.buckets
	// Counted is what the voucher's row counts of its orders (migration
	// 0005, what the live page shows); Rows, the same counted from the
	// orders' rows, in the same snapshot.
	Counted, Rows counts
}

// counts are a voucher's orders that ever were sold, paid, cancelled and
// refunded.
type counts struct{ Sold, Paid, Cancelled, Refunded int64 }

func readState(t *testing.T, db *gorm.DB, rdb redis.UniversalClient, voucherID string) storeState {
	t.Helper()
	ctx := context.Background()
	vid, _ := strconv.ParseInt(voucherID, 10, 64)
	var s storeState
	var rows []struct {
		ID, UserID int64
		Status     string
	}
	// One snapshot for both reads: read apart, a batch committing between
	// them shows its orders but not its stock, and the sum is off by the
	// batch. InnoDB's REPEATABLE READ fixes the snapshot at the first read.
	err := db.Transaction(func(tx *gorm.DB) error {
		row := tx.Raw("SELECT stock, buckets, sold, paid, cancelled, refunded FROM vouchers WHERE id = ?", vid).Row()
		if err := row.Scan(&s.Stock, &s.Buckets, &s.Counted.Sold, &s.Counted.Paid, &s.Counted.Cancelled, &s.Counted.Refunded); err != nil {
			return err
		}
		return tx.Raw("SELECT id, user_id, status FROM voucher_orders WHERE voucher_id = ?", vid).Scan(&rows).Error
	}, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	s.Orders, s.Users = map[string]int64{}, map[int64]int{}
	for _, r := range rows {
		s.Orders[strconv.FormatInt(r.ID, 10)] = r.UserID
		s.Users[r.UserID]++
		s.Rows.Sold++
		switch r.Status {
		case "paid":
			s.Rows.Paid++
		case "cancelled":
			s.Rows.Cancelled++
		case "refunded":
			s.Rows.Paid++
			s.Rows.Refunded++
		}
	}
	// A bucketed voucher: the sum over its buckets, and every bucket's
	// holds and claims.
	s.RedisExists = true
	for b := range s.Buckets {
		k := stock.BucketKeys(vid, s.Buckets, b)
		n, err := rdb.Get(ctx, k.Stock).Int64()
		s.RedisStock += n
		s.RedisExists = s.RedisExists && err == nil
		if err != nil && err != redis.Nil {
			s.RedisErr = err
		}
		s.Holds += rdb.ZCard(ctx, k.Holds).Val() + rdb.ZCard(ctx, k.Claims).Val()
	}
	return s
}

// checkInvariants asserts what must hold at rest for a voucher sold with
// initial units: no oversell, one order per user, stock + orders =
// initial, every 200 in won backed by its row, and the voucher's counts
// equal to its rows'.
func checkInvariants(t *testing.T, s storeState, initial int64, won map[string]string) {
	t.Helper()
	checkCounts(t, s)
	if s.Stock < 0 {
		t.Errorf("oversold: vouchers.stock = %d", s.Stock)
	}
	if got := s.Stock + int64(len(s.Orders)); got != initial {
		t.Errorf("stock %d + orders %d = %d, want initial %d", s.Stock, len(s.Orders), got, initial)
	}
	for u, n := range s.Users {
		if n > 1 {
			t.Errorf("user %d holds %d orders", u, n)
		}
	}
	for u, id := range won {
		owner, ok := s.Orders[id]
		if !ok {
			t.Errorf("user %s was answered 200 with order %s, but no such row exists", u, id)
			continue
		}
		if strconv.FormatInt(owner, 10) != u {
			t.Errorf("order %s belongs to user %d, but was answered to user %s", id, owner, u)
		}
	}
	if len(won) > len(s.Orders) {
		t.Errorf("%d answers of 200 but %d rows", len(won), len(s.Orders))
	}
}

// checkCounts asserts that the voucher's row counts its orders as their
// rows do: every statement that writes or moves an order counts it there
// (package order), and the live page shows those counts.
func checkCounts(t *testing.T, s storeState) {
	t.Helper()
	if s.Counted != s.Rows {
		t.Errorf("the voucher counts its orders %+v, their rows %+v", s.Counted, s.Rows)
	}
}

// waitRest waits until Redis agrees with MySQL for the voucher (no holds
// open, same stock), which the sweeper guarantees within a few periods.
func waitRest(t *testing.T, db *gorm.DB, rdb redis.UniversalClient, voucherID string, within time.Duration) storeState {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		s := readState(t, db, rdb, voucherID)
		if s.Holds == 0 && s.RedisExists && s.RedisStock == s.Stock {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("Redis and MySQL disagree after %s: %+v", within, fmt.Sprintf("mysql stock %d, orders %d, redis stock %d (exists %v, error %v), holds %d", s.Stock, len(s.Orders), s.RedisStock, s.RedisExists, s.RedisErr, s.Holds))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
