package lock

import (
	"context"
	"testing"
	"time"
)

// nopHolder is a holder whose server answers at once: what is left is the
// handle's own work (its contexts, its deadline's timer, the watchdog).
// No server is needed to show that part, and with one its round trip
// (tens of microseconds) would hide it.
type nopHolder struct{}

func (nopHolder) extend(context.Context, time.Duration) error { return nil }
func (nopHolder) release(context.Context) error               { return nil }

// BenchmarkHandle measures a lock's life on the client, from acquired to
// released, without and with a watchdog, for a lock released well before
// its first renewal (as a sync order's per-user lock is). "parallel" runs
// GOMAXPROCS goroutines at once, as a server's requests do, so the cost of
// starting, parking and waking goroutines shows as the scheduler pays it.
func BenchmarkHandle(b *testing.B) {
	ctx := context.Background()
	const ttl = 10 * time.Second
	for _, c := range []struct {
		name string
		o    options
	}{
		{"plain", options{}},
		{"watchdog", options{watchdog: true, maxHold: 5 * time.Second}},
	} {
		life := func() {
			lk := newHandle(ctx, "bench", 0, time.Now(), ttl, nopHolder{}, c.o)
			if err := lk.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				life()
			}
		})
		b.Run(c.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					life()
				}
			})
		})
	}
}
