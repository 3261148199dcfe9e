package live

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"seckill/internal/apperr"
	"seckill/internal/testenv"
	"seckill/internal/web"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestPercentile(t *testing.T) {
	var lat [latencyBuckets]int64
	if p := percentile(lat, 0.5); p != 0 {
		t.Errorf("no answers: p50 %v, want 0", p)
	}
	lat[bucketOf(50*time.Microsecond)] = 98 // bucket 0: up to 0.1 ms
	lat[bucketOf(3*time.Millisecond)] = 2   // up to 3.2 ms
	if p := percentile(lat, 0.5); p != 0.1 {
		t.Errorf("p50 %v, want 0.1", p)
	}
	if p := percentile(lat, 0.99); p != 3.2 {
		t.Errorf("p99 %v, want 3.2", p)
	}
	if b := bucketOf(time.Hour); b != latencyBuckets-1 {
		t.Errorf("an hour in bucket %d, want the last", b)
	}
}

// Two instances' recorders count their own answers; what they add to
// Redis is the sum, per second and in total, by outcome, and made-up
// vouchers (not_found) are not counted at all.
func TestRecordersAddUp(t *testing.T) {
	rdb := testenv.Redis(t, 0)
	ctx := context.Background()
	id := testenv.ID()
	t.Cleanup(func() { rdb.Del(ctx, totalKey(id)) })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	gin.SetMode(gin.TestMode)
	var recorders []*Recorder
	for range 2 {
		rec := NewRecorder(rdb, log)
		recorders = append(recorders, rec)
		r := gin.New()
		r.Use(rec.Middleware(seckillRoute))
		r.POST(seckillRoute, func(c *gin.Context) {
			switch c.Query("answer") {
			case "ok":
				c.Status(http.StatusOK)
			case "sold_out":
				err := apperr.New(apperr.SoldOut, "sold out")
				web.Error(c, log, err)
			default:
				web.Error(c, log, apperr.New(apperr.NotFound, "no such voucher"))
			}
		})
		for _, a := range []string{"ok", "sold_out", "sold_out", "none"} {
			r.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/seckill/"+itoa(id)+"?answer="+a, nil))
		}
	}
	sec := time.Now().Unix()
	t.Cleanup(func() { rdb.Del(ctx, secondKey(id, sec)) })
	for _, rec := range recorders {
		rec.flush(ctx, sec)
	}
	got := rdb.HGetAll(ctx, secondKey(id, sec)).Val()
	if got["ok"] != "2" || got["sold_out"] != "4" || got["not_found"] != "" {
		t.Errorf("second's answers: %v, want ok 2, sold_out 4, no not_found", got)
	}
	var lat int
	for field, v := range got {
		if strings.HasPrefix(field, "lat:") {
			n, _ := strconv.Atoi(v)
			lat += n
		}
	}
	if lat != 6 {
		t.Errorf("%d latencies recorded, want 6", lat)
	}
	if total := rdb.HGetAll(ctx, totalKey(id)).Val(); total["ok"] != "2" || total["sold_out"] != "4" {
		t.Errorf("totals: %v", total)
	}
	if ttl := rdb.TTL(ctx, secondKey(id, sec)).Val(); ttl <= 0 || ttl > keepSecond {
		t.Errorf("a second's key lives %s, want up to %s", ttl, keepSecond)
	}
	// A second flush with nothing new adds nothing.
	for _, rec := range recorders {
		rec.flush(ctx, sec)
	}
	if got := rdb.HGet(ctx, secondKey(id, sec), "ok").Val(); got != "2" {
		t.Errorf("after an empty flush: ok %s, want 2", got)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
