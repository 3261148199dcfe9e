package main

// How the sale runs: the areas of loadConfig for the sale's timings and
// mode, and for async mode's consumers.

import (
	"math"
	"time"

	"seckill/internal/order"
)

// saleVars reads how the sale runs and its timings: how long a unit taken
// in Redis waits for its order row, how often the sweeper gives back the
// units that waited in vain, and how long the server waits for MySQL and
// Redis at start and for requests in flight at shutdown.
func saleVars(c *config, v *vars) {
	c.StockHold = v.dur("STOCK_HOLD", 15*time.Second)
	c.SweepEvery = v.dur("SWEEP_EVERY", 5*time.Second)
	c.ShutdownGrace = v.dur("SHUTDOWN_GRACE", 20*time.Second)
	c.StartupWait = v.dur("STARTUP_WAIT", 30*time.Second)
	c.Writers = v.int("GROUP_COMMIT_WRITERS", order.DefaultWriters, 1, 64)
	c.Mode = v.str("SECKILL_MODE", "sync")
	if c.Mode != "sync" && c.Mode != "async" {
		v.errorf("SECKILL_MODE must be sync or async, not %q", c.Mode)
	}
	if c.StockHold < 3*time.Second {
		v.errorf("STOCK_HOLD must be at least 3s (it is %s)", c.StockHold)
	}
	// A sweep takes the sweeper's lock in Redis and reads MySQL: sweeping
	// more often than this only loads them, and returns no unit sooner
	// than its hold allows.
	if c.SweepEvery > 0 && c.SweepEvery < 100*time.Millisecond {
		v.errorf("SWEEP_EVERY must be at least 100ms (it is %s)", c.SweepEvery)
	}
	// The contract: stock taken by a request whose process dies before it
	// answers is sellable again within 30 seconds. Nobody gives that unit
	// back but the sweeper, at its first sweep after the hold expired: up
	// to STOCK_HOLD + SWEEP_EVERY after it was taken. (Compared as a
	// difference: two durations of 150 years each add up past the largest
	// Duration, to a negative sum that would pass.)
	if c.StockHold > 0 && c.SweepEvery > 0 && c.StockHold > returnedWithin-c.SweepEvery {
		total := c.StockHold + c.SweepEvery
		if total < 0 { // wrapped round
			total = math.MaxInt64
		}
		v.errorf("STOCK_HOLD (%s) + SWEEP_EVERY (%s) is %s, over the %s within which the contract promises that stock taken by a process that died is sellable again (the sweeper returns it at its first sweep after the hold expires); lower STOCK_HOLD or SWEEP_EVERY so that they add up to %s or less",
			c.StockHold, c.SweepEvery, total, returnedWithin, returnedWithin)
	}
}

// asyncVars reads how an instance in async mode consumes the orders'
// stream: its name in the consumer group, how many entries it writes at
// once, and when it claims another consumer's entries or gives up on one.
func asyncVars(c *config, v *vars) {
	c.ClaimIdle = v.dur("CLAIM_IDLE", 5*time.Second)
	c.Batch = v.int("ASYNC_BATCH", 500, 1, 10000)
	c.MaxDeliveries = int64(v.int("ASYNC_MAX_DELIVERIES", 5, 1, 1000))
	c.Consumer = v.str("CONSUMER_NAME", defaultConsumer(c.HTTPAddr))
	// A consumer gives itself CLAIM_IDLE/2 to write a batch, and MySQL
	// needs some of that even when healthy. Shorter, and the entries of a
	// live consumer still writing them are claimed by another: delivered
	// again, counted towards ASYNC_MAX_DELIVERIES, written twice over. (A
	// COMMIT that stalls past CLAIM_IDLE/2, up to the read timeout, can
	// still see its entries claimed: writing an entry twice is a no-op, so
	// this bound is about wasted work, not about correctness.)
	if c.ClaimIdle > 0 && c.ClaimIdle < time.Second {
		v.errorf("CLAIM_IDLE must be at least 1s (it is %s): a consumer's batch may take CLAIM_IDLE/2, and the entries of a live consumer must not be claimed while it writes them", c.ClaimIdle)
	}
}
