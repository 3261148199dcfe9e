package order

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"

	"seckill/internal/testenv"
	"seckill/migrations"
)

// BenchmarkGaleraHotRow measures what a three-node Galera cluster on this
// machine commits of one hot voucher: three writers, as three instances'
// group commits, write batches of orders (writeNew, retried on conflicts
// as the service does), for three seconds, through one node or each
// through its own. It reports orders and conflicts a second. It ignores
// b.N; run it once:
//
//	SECKILL_INTEGRATION=1 go test -run '^$' -bench BenchmarkGaleraHotRow -benchtime 1x ./internal/order
func BenchmarkGaleraHotRow(b *testing.B) {
	g := testenv.StartGalera(b, 3)
	dsns := g.CreateUser(b, "bench", "bench")
	sqlDB, err := sql.Open("mysql", dsns[0])
	if err != nil {
		b.Fatal(err)
	}
	if err := migrations.Apply(context.Background(), sqlDB, migrations.MySQL); err != nil {
		b.Fatal(err)
	}
	sqlDB.Close()
	dbs := make([]*gorm.DB, len(dsns))
	for i, dsn := range dsns {
		dbs[i] = testenv.Open(b, dsn)
	}
	var ids atomic.Int64
	for _, spread := range []bool{false, true} {
		for _, size := range []int{1, 10, 50} {
			layout := "one node"
			if spread {
				layout = "three nodes"
			}
			b.Run(fmt.Sprintf("%s/batch=%d", layout, size), func(b *testing.B) {
				vid := ids.Add(1)
				if err := dbs[0].Exec("INSERT INTO vouchers (id, title, stock, initial_stock, begin_time, end_time, created_at) VALUES (?, 'hot', 1000000000, 1000000000, NOW(), NOW() + INTERVAL 1 HOUR, NOW())", vid).Error; err != nil {
					b.Fatal(err)
				}
				g.WaitSynced(b)
				obs := &conflictCount{}
				var orders atomic.Int64
				const writers, d = 3, 3 * time.Second
				deadline := time.Now().Add(d)
				var wg sync.WaitGroup
				for w := range writers {
					db := dbs[0]
					if spread {
						db = dbs[w]
					}
					wg.Go(func() {
						ctx := context.Background()
						for time.Now().Before(deadline) {
							batch := make([]Order, size)
							for i := range batch {
								id := ids.Add(1)
								batch[i] = Order{ID: id, UserID: id, VoucherID: vid, Status: StatusUnpaid, CreatedAt: time.Now().UTC().Truncate(time.Millisecond)}
							}
							outcome, err := transactRetried(ctx, db, obs, nil, func(tx *gorm.DB) error { return writeNew(tx, batch) })
							if outcome == Written {
								orders.Add(int64(size))
							} else if !conflict(err) {
								b.Error(err)
								return
							}
						}
					})
				}
				wg.Wait()
				b.ReportMetric(float64(orders.Load())/d.Seconds(), "orders/s")
				b.ReportMetric(float64(obs.n.Load())/d.Seconds(), "conflicts/s")
			})
		}
	}
}

// conflictCount counts conflicts, from several goroutines.
type conflictCount struct {
	nobody
	n atomic.Int64
}

func (c *conflictCount) Conflict() { c.n.Add(1) }
