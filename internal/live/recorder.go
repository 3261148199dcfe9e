// Package live shows a sale as it happens. GET /live/{voucherId} serves one
// page, embedded in the binary and written in plain HTML and JavaScript (no
// build step, no script fetched from elsewhere), which listens to
// GET /live/{voucherId}/events: every second a server-sent event with the
// sale's figures. Units left in Redis and in MySQL, the orders, answers per
// second by outcome, the p50 and p99 latency of the buy button, the queue
// of async mode, and the invariant stock + orders = initial, read in one
// MySQL statement, as a green or red mark.
//
// Answers are counted where they are given, by every instance: a Recorder
// counts its instance's answers per voucher in memory (a few atomic adds a
// request) and adds them to Redis once a second, in one pipeline, under the
// second they belong to. So the page shows the whole sale whichever
// instance serves it, at the cost of one round trip a second per instance,
// not one per request.
//
// An admin of a server started with LIVE_CROWD=true (the embedded demo
// sets it) may start a simulated crowd from the page (Crowd): a student
// sees a sale without installing a load tool.
package live

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"seckill/internal/order"
)

// Outcomes are the answers counted, in the order the page shows them: the
// contract's codes the buy button gives.
var Outcomes = []string{"ok", "sold_out", "already_ordered", "busy", "not_started", "ended", "not_found", "unavailable", "unauthorized", "invalid_argument", "forbidden", "internal"}

var outcomeIndex = func() map[string]int {
	m := map[string]int{}
	for i, o := range Outcomes {
		m[o] = i
	}
	return m
}()

// latencyBuckets: bucket i counts answers that took at most 0.1 ms * 2^i;
// the last takes the rest. A percentile is read as its bucket's bound: to
// within a factor of two, which is what a live view needs.
const latencyBuckets = 20

func bucketOf(d time.Duration) int {
	bound := 100 * time.Microsecond
	for i := range latencyBuckets - 1 {
		if d <= bound {
			return i
		}
		bound *= 2
	}
	return latencyBuckets - 1
}

// boundMS is the upper bound of latency bucket i, in milliseconds.
func boundMS(i int) float64 { return 0.1 * float64(int64(1)<<i) }

// counts are one voucher's answers in the second being counted.
type counts struct {
	answers [16]atomic.Int64 // by outcomeIndex
	latency [latencyBuckets]atomic.Int64
	quiet   int // seconds since the last answer; Run's alone
}

// Bounds on the vouchers counted: a voucher quiet for forgetAfter is
// forgotten (a request that races the forgetting loses its count, once in
// ten minutes of silence), and no more than maxVouchers are counted at
// once, so that a flood of made-up voucher IDs cannot grow the map.
const (
	forgetAfter = 600 // seconds
	maxVouchers = 10_000
)

// Recorder counts the buy button's answers per voucher and second, and
// adds them to Redis once a second (Run).
type Recorder struct {
	rdb      redis.UniversalClient
	log      *slog.Logger
	vouchers sync.Map // voucher ID -> *counts
	n        atomic.Int64
}

// NewRecorder returns a Recorder that adds its counts to rdb.
func NewRecorder(rdb redis.UniversalClient, log *slog.Logger) *Recorder {
	return &Recorder{rdb: rdb, log: log}
}

// Middleware counts the answers of route (the buy button's), per voucher.
func (r *Recorder) Middleware(route string) gin.HandlerFunc {
	return func(c *gin.Context) {
		if c.FullPath() != route {
			c.Next()
			return
		}
		start := time.Now()
		c.Next()
		id, err := strconv.ParseInt(c.Param("voucherId"), 10, 64)
		if err != nil || id <= 0 {
			return // not a voucher: nothing to show
		}
		answer := order.Answer(c)
		if answer == "not_found" || answer == "invalid_argument" {
			return // not a voucher of ours
		}
		i, ok := outcomeIndex[answer]
		if !ok {
			i = outcomeIndex["internal"]
		}
		v, _ := r.vouchers.Load(id)
		if v == nil {
			if r.n.Load() >= maxVouchers {
				return
			}
			var loaded bool
			if v, loaded = r.vouchers.LoadOrStore(id, &counts{}); !loaded {
				r.n.Add(1)
			}
		}
		cs := v.(*counts)
		cs.answers[i].Add(1)
		cs.latency[bucketOf(time.Since(start))].Add(1)
	}
}

// secondKey holds the answers to voucher id in second sec of all
// instances: field outcome -> count, and "lat:<bucket>" -> count.
func secondKey(id, sec int64) string {
	return "seckill:live:" + strconv.FormatInt(id, 10) + ":" + strconv.FormatInt(sec, 10)
}

// totalKey holds the answers to voucher id since its sale began.
func totalKey(id int64) string { return "seckill:live:" + strconv.FormatInt(id, 10) + ":total" }

// keep is how long the counts stay in Redis: a second's for the page to
// read it, the totals for the day of the sale.
const (
	keepSecond = 2 * time.Minute
	keepTotal  = 24 * time.Hour
)

// Run adds the counts to Redis at the start of every second until ctx
// ends, and once more then.
func (r *Recorder) Run(ctx context.Context) {
	for {
		now := time.Now()
		next := now.Truncate(time.Second).Add(time.Second)
		select {
		case <-ctx.Done():
			r.flush(context.WithoutCancel(ctx), now.Unix())
			return
		case <-time.After(time.Until(next)):
		}
		// The second that just ended.
		r.flush(ctx, next.Unix()-1)
	}
}

func (r *Recorder) flush(ctx context.Context, sec int64) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	pipe := r.rdb.Pipeline()
	r.vouchers.Range(func(k, v any) bool {
		id, cs := k.(int64), v.(*counts)
		key, total := secondKey(id, sec), totalKey(id)
		counted := false
		for i := range Outcomes {
			if n := cs.answers[i].Swap(0); n > 0 {
				pipe.HIncrBy(ctx, key, Outcomes[i], n)
				pipe.HIncrBy(ctx, total, Outcomes[i], n)
				counted = true
			}
		}
		for i := range cs.latency {
			if n := cs.latency[i].Swap(0); n > 0 {
				pipe.HIncrBy(ctx, key, "lat:"+strconv.Itoa(i), n)
			}
		}
		if counted {
			cs.quiet = 0
			pipe.Expire(ctx, key, keepSecond)
			pipe.Expire(ctx, total, keepTotal)
		} else if cs.quiet++; cs.quiet >= forgetAfter {
			r.vouchers.Delete(id)
			r.n.Add(-1)
		}
		return true
	})
	if pipe.Len() == 0 {
		return
	}
	if _, err := pipe.Exec(ctx); err != nil {
		// The page misses this second's counts; the sale goes on.
		r.log.WarnContext(ctx, "live: add answers to Redis", "err", err)
	}
}
