package metrics_test

import (
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"seckill/internal/metrics"
	"seckill/internal/order"
)

// Package order names its stages and lock results by the strings that
// label them, and this package counts only the names it knows: a name
// spelled differently on one side would never be counted. Each of order's
// names must reach its series.
func TestObserverKnowsOrdersNames(t *testing.T) {
	m := metrics.New(slog.New(slog.NewTextHandler(io.Discard, nil)))
	var obs order.Observer = m
	for _, s := range []string{order.StageStock, order.StageLock, order.StageCommit, order.StageConfirm} {
		obs.Stage(s, time.Millisecond)
	}
	for _, r := range []string{order.LockObtained, order.LockContended, order.LockLost} {
		obs.UserLock(r)
	}
	obs.Unconfirmed(2)
	for _, r := range []string{order.CancelByBuyer, order.CancelTimeout} {
		obs.Cancelled(r)
	}
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	page := rec.Body.String()
	for _, want := range []string{
		`seckill_stage_duration_seconds_count{stage="stock"} 1`,
		`seckill_stage_duration_seconds_count{stage="lock"} 1`,
		`seckill_stage_duration_seconds_count{stage="commit"} 1`,
		`seckill_stage_duration_seconds_count{stage="confirm"} 1`,
		`seckill_holds_unconfirmed_total 2`,
		`seckill_user_lock_total{result="obtained"} 1`,
		`seckill_user_lock_total{result="contended"} 1`,
		`seckill_user_lock_total{result="lost"} 1`,
		`seckill_orders_cancelled_total{reason="buyer"} 1`,
		`seckill_orders_cancelled_total{reason="timeout"} 1`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("no %s in the metrics", want)
		}
	}
}
