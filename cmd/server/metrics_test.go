package main

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"seckill/internal/stock"
	"seckill/internal/testenv"
)

// metricsDB is the Redis database of the metrics tests: theirs alone.
const metricsDB = 8

// scrape GETs url with token ("" for none) and parses the text format.
func scrape(t *testing.T, url, token string) map[string]*dto.MetricFamily {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d", url, resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("GET %s: Content-Type %q, want text/plain", url, ct)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: not the Prometheus text format: %v", url, err)
	}
	return fams
}

// series finds the series of family name whose labels include want
// (name=value pairs); nil if there is none.
func series(fams map[string]*dto.MetricFamily, name string, want ...string) *dto.Metric {
	f := fams[name]
	if f == nil {
		return nil
	}
next:
	for _, m := range f.GetMetric() {
		for i := 0; i+1 < len(want); i += 2 {
			found := false
			for _, l := range m.GetLabel() {
				if l.GetName() == want[i] && l.GetValue() == want[i+1] {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		return m
	}
	return nil
}

// value is a counter's or gauge's value, or a histogram's count; -1 when
// the series is missing.
func value(fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	m := series(fams, name, labels...)
	switch {
	case m == nil:
		return -1
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return -1
}

// histSum is a histogram's sum of observations; -1 when missing.
func histSum(fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	m := series(fams, name, labels...)
	if m == nil || m.Histogram == nil {
		return -1
	}
	return m.Histogram.GetSampleSum()
}

// TestMetricsCountASale runs a small sale, keeps count of every answer
// the buyers got, and checks that /metrics counts the same: each code as
// often as it was answered, one order per group-commit (or consumer)
// slot, a timing for every request; then that the sweeper's repairs are
// counted, and that the pools are reported.
func TestMetricsCountASale(t *testing.T) {
	for _, mode := range []string{"sync", "async"} {
		t.Run(mode, func(t *testing.T) {
			st := newStack(t, metricsDB)
			// A burst of 3 and a rate that never refills: a buyer's fourth
			// click is refused busy (429), deterministically.
			in := start(t, st.env(freeAddr(t), "SECKILL_MODE", mode, "SECKILL_BURST", "3", "SECKILL_RATE", "0.001"))
			admin, _ := mustLogin(t, in.Base, adminPhone)
			const units = 3
			vid := openVoucher(t, in.Base, admin, units)
			users := loginMany(t, in.Base, 6)

			seen := map[string]int{} // code ("ok" for 200) -> answers
			var mu sync.Mutex
			note := func(r reply, err error) {
				t.Helper()
				if err != nil {
					t.Error(err)
					return
				}
				code := r.Code()
				if r.Status == http.StatusOK {
					code = "ok"
				}
				mu.Lock()
				seen[code]++
				mu.Unlock()
			}
			// Everyone at once, for units they cannot all get.
			gate := make(chan struct{})
			var wg sync.WaitGroup
			for _, u := range users {
				wg.Go(func() {
					<-gate
					note(call("POST", in.Base+"/seckill/"+vid, u.Token, nil))
				})
			}
			close(gate)
			wg.Wait()
			if seen["ok"] != units || seen["sold_out"] != len(users)-units {
				t.Fatalf("answers of the rush: %v, want %d ok and %d sold_out", seen, units, len(users)-units)
			}
			// Then the other outcomes a buyer can meet, on a second voucher
			// that is not sold out (on a sold-out one, a buyer's second
			// click may rightly be answered sold_out).
			vid2 := openVoucher(t, in.Base, admin, 2)
			u := users[0]                                                         // one click spent in the rush
			note(call("POST", in.Base+"/seckill/"+vid2, u.Token, nil))            // ok
			note(call("POST", in.Base+"/seckill/"+vid2, u.Token, nil))            // a second click: already_ordered
			note(call("POST", in.Base+"/seckill/"+vid2, u.Token, nil))            // over the burst: busy
			note(call("POST", in.Base+"/seckill/"+vid, "", nil))                  // no token: unauthorized
			note(call("POST", in.Base+"/seckill/x", users[1].Token, nil))         // invalid_argument
			note(call("POST", in.Base+"/seckill/999999999", users[2].Token, nil)) // not_found
			const orders = units + 1
			if seen["ok"] != orders {
				t.Errorf("ok answered %d times, want %d (all: %v)", seen["ok"], orders, seen)
			}
			for _, code := range []string{"already_ordered", "busy", "unauthorized", "invalid_argument", "not_found"} {
				if seen[code] != 1 {
					t.Errorf("%s answered %d times, want 1 (all: %v)", code, seen[code], seen)
				}
			}
			total := 0
			for _, n := range seen {
				total += n
			}

			// The sweeper's repairs. Drift: Redis counts 5 units that
			// MySQL does not have; the sweeper sets it back to 0. A dead
			// request: a unit of a second voucher taken in Redis with a
			// 3s hold and never written (the second voucher's last); the
			// sweeper puts it back.
			rdb := testenv.Redis(t, metricsDB)
			ctx := context.Background()
			id, _ := strconv.ParseInt(vid, 10, 64)
			if err := rdb.Set(ctx, stock.KeysOf(id).Stock, 5, 0).Err(); err != nil {
				t.Fatal(err)
			}
			id2, _ := strconv.ParseInt(vid2, 10, 64)
			if _, res, err := stock.NewStore(rdb, 3*time.Second).Take(ctx, id2, 1, 1<<40); err != nil || res != stock.Taken {
				t.Fatalf("take a unit as a request that then dies: %v %v", res, err)
			}

			var fams map[string]*dto.MetricFamily
			deadline := time.Now().Add(15 * time.Second)
			for {
				fams = scrape(t, in.Base+"/metrics", admin)
				settled := value(fams, "seckill_stock_drift_corrected_total") >= 1 && value(fams, "seckill_holds_reclaimed_total") >= 1
				if mode == "async" {
					settled = settled && histSum(fams, "seckill_consumer_batch_size") >= orders && value(fams, "seckill_queue_lag") == 0 && value(fams, "seckill_queue_pending") == 0
				}
				if settled || time.Now().After(deadline) {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}

			// Every answer counted, under its code, and nothing else.
			for _, code := range []string{"ok", "sold_out", "already_ordered", "busy", "unavailable", "not_started", "ended", "not_found", "invalid_argument", "unauthorized", "forbidden", "internal"} {
				if got := value(fams, "seckill_answers_total", "code", code); got != float64(seen[code]) {
					t.Errorf("seckill_answers_total{code=%q} = %v, the buyers saw %d", code, got, seen[code])
				}
			}
			if got := value(fams, "seckill_request_duration_seconds"); got != float64(total) {
				t.Errorf("seckill_request_duration_seconds has %v observations, want one per request: %d", got, total)
			}
			if got := histSum(fams, "seckill_request_duration_seconds"); got <= 0 {
				t.Errorf("seckill_request_duration_seconds sums to %v", got)
			}
			// Every order went through the stock script, and in sync mode
			// through the lock and a commit.
			if got := value(fams, "seckill_stage_duration_seconds", "stage", "stock"); got < orders {
				t.Errorf("stock script timed %v times, want at least %d", got, orders)
			}
			wantWrites := float64(orders)
			if mode == "async" {
				wantWrites = 0
			}
			for _, c := range []struct {
				name   string
				labels []string
			}{
				{"seckill_stage_duration_seconds", []string{"stage", "lock"}},
				{"seckill_stage_duration_seconds", []string{"stage", "commit"}},
				{"seckill_user_lock_total", []string{"result", "obtained"}},
			} {
				if got := value(fams, c.name, c.labels...); got != wantWrites {
					t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, wantWrites)
				}
			}
			for _, r := range []string{"contended", "lost"} {
				if got := value(fams, "seckill_user_lock_total", "result", r); got != 0 {
					t.Errorf("seckill_user_lock_total{result=%q} = %v, want 0", r, got)
				}
			}
			// The batches add up to the orders: each written once.
			commits, consumed := histSum(fams, "seckill_group_commit_batch_size"), histSum(fams, "seckill_consumer_batch_size")
			if mode == "sync" && (commits != orders || consumed != 0) {
				t.Errorf("group commit batches sum to %v, consumer batches to %v; want %d and 0", commits, consumed, orders)
			}
			if mode == "async" && (commits != 0 || consumed != orders) {
				t.Errorf("group commit batches sum to %v, consumer batches to %v; want 0 and %d", commits, consumed, orders)
			}
			if got := value(fams, "seckill_stock_drift_corrected_total"); got < 1 {
				t.Errorf("seckill_stock_drift_corrected_total = %v after Redis drifted", got)
			}
			if got := value(fams, "seckill_holds_reclaimed_total"); got != 1 {
				t.Errorf("seckill_holds_reclaimed_total = %v, want 1", got)
			}
			// The queue: only in async mode, and empty once written.
			for _, name := range []string{"seckill_queue_length", "seckill_queue_lag", "seckill_queue_pending", "seckill_queue_dead_letters"} {
				got := value(fams, name)
				switch {
				case mode == "sync" && got != -1:
					t.Errorf("%s = %v in sync mode, which has no queue", name, got)
				case mode == "async" && name != "seckill_queue_length" && got != 0 && got != -1:
					t.Errorf("%s = %v once the orders are written, want 0", name, got)
				case mode == "async" && got < 0: // the length falls when the stream is trimmed
					t.Errorf("%s missing", name)
				}
			}
			// The pools, read when scraped.
			if got := value(fams, "seckill_redis_pool_hits_total"); got <= 0 {
				t.Errorf("seckill_redis_pool_hits_total = %v after a sale", got)
			}
			for _, state := range []string{"idle", "in_use"} {
				if got := value(fams, "seckill_redis_pool_connections", "state", state); got < 0 {
					t.Errorf("seckill_redis_pool_connections{state=%q} missing", state)
				}
			}
			if got := value(fams, "go_sql_open_connections", "db_name", "mysql"); got < 1 {
				t.Errorf("go_sql_open_connections{db_name=\"mysql\"} = %v", got)
			}
			if got := value(fams, "go_sql_max_open_connections", "db_name", "mysql"); got != 10 {
				t.Errorf("go_sql_max_open_connections = %v, want MYSQL_MAX_OPEN_CONNS (10)", got)
			}
			for name, f := range fams {
				if strings.HasPrefix(name, "seckill_") && f.GetHelp() == "" {
					t.Errorf("%s has no HELP text", name)
				}
			}
		})
	}
}

// TestMetricsAccess checks who may read /metrics: on the main port only
// admins; with METRICS_ADDR, anyone on that address and nobody on the
// main port.
func TestMetricsAccess(t *testing.T) {
	st := newStack(t, metricsDB)

	t.Run("main port", func(t *testing.T) {
		in := start(t, st.env(freeAddr(t)))
		userToken, _ := mustLogin(t, in.Base, "13900000001")
		// call, not mustCall: a wrong answer here is the metrics
		// themselves, not JSON, and the status says enough.
		if r, _ := call("GET", in.Base+"/metrics", "", nil); r.Status != http.StatusUnauthorized || r.Code() != "unauthorized" {
			t.Errorf("GET /metrics without a token: %d, want 401 unauthorized", r.Status)
		}
		if r, _ := call("GET", in.Base+"/metrics", userToken, nil); r.Status != http.StatusForbidden || r.Code() != "forbidden" {
			t.Errorf("GET /metrics as a user: %d, want 403 forbidden", r.Status)
		}
	})

	t.Run("METRICS_ADDR", func(t *testing.T) {
		maddr := freeAddr(t)
		in := start(t, st.env(freeAddr(t), "METRICS_ADDR", maddr))
		admin, _ := mustLogin(t, in.Base, adminPhone)
		fams := scrape(t, "http://"+maddr+"/metrics", "")
		if value(fams, "seckill_answers_total", "code", "ok") != 0 {
			t.Errorf("seckill_answers_total{code=\"ok\"} missing or not 0 before any sale")
		}
		if r, _ := call("GET", in.Base+"/metrics", admin, nil); r.Status != http.StatusNotFound {
			t.Errorf("GET /metrics on the main port with METRICS_ADDR set: %d, want 404", r.Status)
		}
		if err := in.Stop(); err != nil {
			t.Fatalf("stop: %v", err)
		}
		if resp, err := http.Get("http://" + maddr + "/metrics"); err == nil {
			resp.Body.Close()
			t.Errorf("the metrics server still answers after shutdown: %d", resp.StatusCode)
		}
	})
}
