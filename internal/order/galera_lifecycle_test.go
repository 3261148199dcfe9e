package order

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"gorm.io/gorm"

	"seckill/internal/apperr"
	"seckill/internal/idworker"
	"seckill/internal/lock"
	"seckill/internal/order/queue"
	"seckill/internal/payment"
	"seckill/internal/stock"
	"seckill/internal/testenv"
	"seckill/internal/voucher"
	"seckill/migrations"
)

// An order's later life on a Galera cluster (issue 34): three instances,
// each through its own node, share one cluster and one Redis. One cluster
// serves every case, each with a database of its own.
func TestGaleraLifecycle(t *testing.T) {
	g := testenv.StartGalera(t, 3)
	t.Run("conflicts retried", func(t *testing.T) { galeraLifecycleConflicts(t, g) })
}

// conflictCounting is counting that also counts conflicts, from several
// goroutines.
type conflictCounting struct {
	*counting
	conflicts atomic.Int64
}

func (c *conflictCounting) Conflict() { c.conflicts.Add(1) }

// newGaleraRig is newLifecycleRig on g: a database of its own, migrated,
// instance i (sync mode) through node i, with a pool of causal reads on
// that node as its Truth (as the server opens on Galera), one Redis of its
// own, and a voucher of initial units at price 500. The rig's db is node
// 0's. It returns every node's handle too.
func newGaleraRig(t *testing.T, g *testenv.Galera, initial int64) (*lifecycleRig, []*gorm.DB, *conflictCounting) {
	t.Helper()
	name := testenv.Name("lc")
	dsns := g.CreateUser(t, name, name)
	sqlDB, err := sql.Open("mysql", dsns[0])
	if err != nil {
		t.Fatal(err)
	}
	err = migrations.Apply(context.Background(), sqlDB, migrations.MySQL)
	sqlDB.Close()
	if err != nil {
		t.Fatal(err)
	}
	g.WaitSynced(t)

	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	obs := &conflictCounting{counting: &counting{}}
	rdb := testenv.StartRedis(t).Client(t)
	r := &lifecycleRig{rdb: rdb, obs: obs.counting, initial: initial, stocks: stock.NewStore(rdb, 15*time.Second)}
	r.provider = &flakyProvider{Fake: payment.NewFake([]byte("lifecycle-test-secret-0123456789abcdef"), log)}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); wg.Wait(); r.provider.Close() })
	dbs := make([]*gorm.DB, len(dsns))
	var vouchers *voucher.Service
	for i, dsn := range dsns {
		dbs[i] = testenv.Open(t, dsn)
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Params = map[string]string{"wsrep_sync_wait": "1"}
		vouchers = voucher.NewService(dbs[i], r.stocks, nil, nil, time.Now, log)
		q := queue.New(rdb, r.stocks)
		c := DefaultConfig
		c.Observer, c.Provider, c.Truth = obs, r.provider, testenv.Open(t, cfg.FormatDSN())
		s := NewService(dbs[i], q, vouchers, r.stocks, lock.NewRedis(rdb), idworker.New(rdb, time.Now, IDFloor(dbs[i], q)), time.Now, log, c)
		wg.Go(func() { s.RunWriter(ctx) })
		t.Cleanup(s.Close)
		r.svcs = append(r.svcs, s)
	}
	r.db = dbs[0]
	title, price, within := "galera", int64(500), 900
	begin, end := time.Now().Add(-time.Minute), time.Now().Add(time.Hour)
	v, err := vouchers.Create(context.Background(), 0, "", voucher.CreateInput{Title: &title, Stock: &initial, BeginTime: &begin, EndTime: &end, Price: &price, PayWithin: &within})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Sscan(v.ID, &r.voucher)
	g.WaitSynced(t)
	return r, dbs, obs
}

// galeraLifecycleConflicts: 240 orders of one voucher, then, all released
// at once and each through the instance (and node) of its order's number,
// 60 refunds of paid orders, 60 cancels by buyers, 60 payments, and 60
// deadlines passing under three instances' expirers. Each of them
// updates the voucher's row (its stock, or its paid count): two nodes
// writing it at once cannot both commit, and Galera refuses the second
// with error 1213. Before issue 34 a cancel or a refund that lost was
// answered 503, and an expirer's batch failed for its next round; now each
// is run again whole, and none fails. The provider retries a payment
// answered 503, as it would; those are counted.
func galeraLifecycleConflicts(t *testing.T, g *testenv.Galera) {
	const n = 60
	r, dbs, obs := newGaleraRig(t, g, 300)
	ctx := context.Background()
	orders := r.buy(t, 4*n)
	refunds, cancels, dues, payments := orders[:n], orders[n:2*n], orders[2*n:3*n], orders[3*n:]
	// A payment answered 503 is delivered again, as the provider would:
	// the webhook's transaction is not retried on a conflict (webhook.go).
	var again atomic.Int64
	pay := func(s *Service, id int64, event string) error {
		e := payment.Event{ID: event, OrderID: id, Amount: 500}
		for range 20 {
			a, err := s.ApplyPayment(ctx, e)
			switch {
			case err == nil && a.Status == StatusPaid:
				return nil
			case !errors.Is(err, apperr.ErrUnavailable):
				return fmt.Errorf("answered %+v, %w", a, err)
			}
			again.Add(1)
			time.Sleep(20 * time.Millisecond)
		}
		return errors.New("503 twenty times")
	}
	for i, id := range refunds {
		if err := pay(r.svcs[i%3], id, fmt.Sprintf("before-%d", id)); err != nil {
			t.Fatalf("pay order %d: %v", id, err)
		}
	}
	if err := r.db.Exec("UPDATE voucher_orders SET pay_by = ? WHERE id IN ?", time.Now().UTC().Add(300*time.Millisecond), dues).Error; err != nil {
		t.Fatal(err)
	}
	g.WaitSynced(t)
	again.Store(0) // the storm's, from here

	var (
		wg           sync.WaitGroup
		start        = make(chan struct{})
		mu           sync.Mutex
		failed       = map[string]int{}
		expiryFailed atomic.Int64
	)
	fail := func(what string, id int64, err error) {
		mu.Lock()
		failed[what]++
		mu.Unlock()
		t.Errorf("%s order %d: %v", what, id, err)
	}
	// The requests arrive over a second, as a crowd's do: about 200 a
	// second, a third through each node.
	arrive := func() {
		<-start
		time.Sleep(time.Duration(rand.IntN(1000)) * time.Millisecond)
	}
	for i := range n {
		s := r.svcs[i%3]
		wg.Go(func() {
			arrive()
			if _, err := s.Refund(ctx, refunds[i], 0, true); err != nil {
				fail("refund", refunds[i], err)
			}
		})
		wg.Go(func() {
			arrive()
			if _, err := s.Cancel(ctx, cancels[i], int64(n+i+1)); err != nil {
				fail("cancel", cancels[i], err)
			}
		})
		wg.Go(func() {
			arrive()
			if err := pay(s, payments[i], fmt.Sprintf("storm-%d", payments[i])); err != nil {
				fail("pay", payments[i], err)
			}
		})
	}
	for i, s := range r.svcs {
		wg.Go(func() {
			<-start
			for range 20 {
				if _, err := s.Expire(ctx); err != nil {
					expiryFailed.Add(1)
					t.Errorf("expirer of node %d: %v", i, err)
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
	close(start)
	wg.Wait()
	// Anything the expirers left (their rounds failed) is expired now.
	if _, err := r.svcs[0].Expire(ctx); err != nil {
		t.Fatal(err)
	}
	g.WaitSynced(t)
	t.Logf("conflicts retried: %d; of %d each failed: %v; expirer rounds failed: %d of %d; payments delivered again after a 503: %d",
		obs.conflicts.Load(), n, failed, expiryFailed.Load(), 20*len(r.svcs), again.Load())

	by := r.atRest(t)
	want := map[string]int64{StatusRefunded: n, StatusCancelled: 2 * n, StatusPaid: n}
	for status, c := range want {
		if by[status] != c {
			t.Errorf("orders by status %v, want %v", by, want)
			break
		}
	}
	// Every node holds the same.
	var first string
	for i, db := range dbs {
		var left, paid, cancelled, refunded int64
		db.Raw("SELECT stock, paid, cancelled, refunded FROM vouchers WHERE id = ?", r.voucher).Row().Scan(&left, &paid, &cancelled, &refunded)
		got := fmt.Sprintf("stock %d, paid %d, cancelled %d, refunded %d", left, paid, cancelled, refunded)
		if i == 0 {
			first = got
		} else if got != first {
			t.Errorf("node %d holds %s, node 0 %s", i, got, first)
		}
	}
	if obs.conflicts.Load() == 0 {
		t.Errorf("no conflict counted: the test provoked none, and proves nothing")
	}
}
