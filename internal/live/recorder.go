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
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"seckill/internal/web"
)

// Outcomes are the answers counted, in the order the page shows them: the
// contract's codes the buy button gives to a buyer of a voucher that
// exists. Not unauthorized, not_found or invalid_argument: a request
// without a token, or for an ID that is no voucher, is nobody buying
// anything, and counting it would let anyone, without an account, fill
// the Recorder with made-up vouchers (see Middleware).
var Outcomes = []string{"ok", "sold_out", "already_ordered", "not_admitted", "busy", "not_started", "ended", "unavailable", "forbidden", "internal"}

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
// once. Only vouchers that exist are counted (Middleware), so the bound
// is one on the admins' vouchers, never reached by made-up IDs.
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
	// id names this Recorder in its batches' markers (add.lua): batches
	// of two instances, or of one before and after a restart, never
	// share a name.
	id string

	// Run's alone:
	seq     int64   // the last batch's number
	pending []batch // batches Redis has not confirmed, oldest first
}

// NewRecorder returns a Recorder that adds its counts to rdb.
func NewRecorder(rdb redis.UniversalClient, log *slog.Logger) *Recorder {
	b := make([]byte, 8)
	rand.Read(b)
	return &Recorder{rdb: rdb, log: log, id: hex.EncodeToString(b)}
}

// Middleware counts the answers of route (the buy button's), per voucher.
//
// It counts the answers to a voucher only once it knows the voucher
// exists: a voucher is counted from its first answer that the seckill
// flow gives after finding it (afterLookup), and from then on every
// answer to it, the busy ones of the per-user rate and the in-flight cap
// included, which come before any lookup. Answers to other IDs are not
// counted at all: else ten thousand requests without a token, each to a
// made-up ID, would fill the Recorder (maxVouchers) and stop it counting
// the real sale, and have every flush write to Redis for each of them.
//
// cmd/server installs Observe instead, through web.Observe with the
// metrics' observer, so that one middleware times both.
func (r *Recorder) Middleware(route string) gin.HandlerFunc {
	return web.Observe(route, r.Observe)
}

// Observe is a web.Observer of the buy button's route: it counts one
// answer, as Middleware describes.
func (r *Recorder) Observe(c *gin.Context, answer string, took time.Duration) {
	i, ok := outcomeIndex[answer]
	if !ok {
		return // no token, no such voucher, no valid ID: no buyer, or nothing to buy
	}
	id, err := strconv.ParseInt(c.Param("voucherId"), 10, 64)
	if err != nil || id <= 0 {
		return
	}
	v, _ := r.vouchers.Load(id)
	if v == nil {
		if !afterLookup(c) || r.n.Load() >= maxVouchers {
			return
		}
		var loaded bool
		if v, loaded = r.vouchers.LoadOrStore(id, &counts{}); !loaded {
			r.n.Add(1)
		}
	}
	cs := v.(*counts)
	cs.answers[i].Add(1)
	cs.latency[bucketOf(took)].Add(1)
}

// afterLookup reports whether the buy button's answer in c proves that
// the voucher exists: a 200, or a 409 (not_started, ended, sold_out,
// already_ordered, not_admitted), which on this route only the seckill flow answers, and
// only after it found the voucher (voucher.Service.Find, which fails with
// not_found or unavailable). Nothing else proves it: a request without a
// token (401), a malformed ID (400) or one over the user's rate or the
// in-flight cap (429) is answered before any lookup. The flow's own busy
// (another request of the user holds a unit) is not counted as proof
// either, being a 429 like the rate's: that other request's 200 or 409
// soon is.
func afterLookup(c *gin.Context) bool {
	return c.Writer.Status() == http.StatusOK || c.Writer.Status() == http.StatusConflict
}

// secondKey holds the answers to voucher id in second sec of all
// instances: field outcome -> count, and "lat:<bucket>" -> count. The
// braces put a voucher's keys in one Redis Cluster slot: add.lua writes
// them together.
func secondKey(id, sec int64) string {
	return "seckill:live:{" + strconv.FormatInt(id, 10) + "}:" + strconv.FormatInt(sec, 10)
}

// totalKey holds the answers to voucher id since its sale began.
func totalKey(id int64) string { return "seckill:live:{" + strconv.FormatInt(id, 10) + "}:total" }

// sentKey marks batch seq of the Recorder named recorder as added to
// voucher id's counts (add.lua).
func sentKey(id int64, recorder string, seq int64) string {
	return "seckill:live:{" + strconv.FormatInt(id, 10) + "}:sent:" + recorder + ":" + strconv.FormatInt(seq, 10)
}

// keep is how long the counts stay in Redis: a second's for the page to
// read it, the totals for the day of the sale.
const (
	keepSecond = 2 * time.Minute
	keepTotal  = 24 * time.Hour
)

// A batch Redis did not confirm is sent again every second for up to
// retryFor, then given up (Redis has been away that long; the page has
// shown the trouble). Its marker outlives the last try, so that a try
// whose reply was lost is never added again.
const (
	retryFor   = time.Minute
	keepMarker = 2 * retryFor
)

//go:embed add.lua
var addLua string

var addScript = redis.NewScript(addLua)

// batch is one voucher's answers of one second, as sent to Redis. It keeps
// its number until Redis confirms it: sent again, it is the same batch,
// which add.lua adds once.
type batch struct {
	voucher int64
	sec     int64
	seq     int64
	fields  []any // field, count, field, count, ...
}

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

// flush takes the answers counted so far as second sec's, and sends them
// to Redis in one pipeline, with the batches Redis has not yet confirmed.
// Counts are taken out of memory before they are sent; a batch that fails
// stays pending (never dropped, never merged back into the counts, which
// would give it a new name) until Redis confirms it or retryFor passes.
// So a slow Redis, or a pipeline that times out, delays the counts rather
// than losing them, and never counts them twice.
func (r *Recorder) flush(ctx context.Context, sec int64) {
	r.vouchers.Range(func(k, v any) bool {
		id, cs := k.(int64), v.(*counts)
		var fields []any
		for i := range Outcomes {
			if n := cs.answers[i].Swap(0); n > 0 {
				fields = append(fields, Outcomes[i], n)
			}
		}
		if fields == nil {
			if cs.quiet++; cs.quiet >= forgetAfter {
				r.vouchers.Delete(id)
				r.n.Add(-1)
			}
			return true
		}
		cs.quiet = 0
		for i := range cs.latency {
			if n := cs.latency[i].Swap(0); n > 0 {
				fields = append(fields, "lat:"+strconv.Itoa(i), n)
			}
		}
		r.seq++
		r.pending = append(r.pending, batch{voucher: id, sec: sec, seq: r.seq, fields: fields})
		return true
	})
	if given := r.giveUp(sec); given > 0 {
		r.log.WarnContext(ctx, "live: gave up adding answers to Redis", "batches", given, "tried_for", retryFor)
	}
	if len(r.pending) == 0 {
		return
	}

	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	pipe := r.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(r.pending))
	for i, b := range r.pending {
		keys := []string{secondKey(b.voucher, b.sec), totalKey(b.voucher), sentKey(b.voucher, r.id, b.seq)}
		args := append([]any{int64(keepSecond / time.Second), int64(keepTotal / time.Second), int64(keepMarker / time.Second)}, b.fields...)
		// EVAL, not EVALSHA: a pipeline cannot fall back on NOSCRIPT,
		// and Redis compiles a script once per hash either way.
		cmds[i] = addScript.Eval(ctx, pipe, keys, args...)
	}
	pipe.Exec(ctx) // each command's error is looked at below
	kept := r.pending[:0]
	var failed error
	for i, b := range r.pending {
		if err := cmds[i].Err(); err != nil {
			kept = append(kept, b)
			failed = err
		}
	}
	clear(r.pending[len(kept):])
	r.pending = kept
	if failed != nil {
		// The page misses these counts until a try succeeds; the sale
		// goes on.
		r.log.WarnContext(ctx, "live: add answers to Redis; trying again next second", "batches", len(kept), "err", failed)
	}
}

// giveUp drops the pending batches older than retryFor at second sec, and
// returns how many.
func (r *Recorder) giveUp(sec int64) int {
	oldest := sec - int64(retryFor/time.Second)
	n := 0
	for n < len(r.pending) && r.pending[n].sec < oldest {
		n++
	}
	if n > 0 {
		r.pending = append(r.pending[:0], r.pending[n:]...)
	}
	return n
}
