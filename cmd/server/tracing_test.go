package main

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// collector is an OTLP/HTTP trace receiver of the test's own: it keeps
// every span the server exports.
type collector struct {
	mu    sync.Mutex
	spans []*tracepb.Span
	posts int
}

func startCollector(t *testing.T) (*collector, string) {
	c := &collector{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/traces" {
			http.NotFound(w, r)
			return
		}
		var body io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = zr
		}
		raw, err := io.ReadAll(body)
		var req coltrace.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(raw, &req)
		}
		if err != nil {
			t.Errorf("collector: %v", err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		c.posts++
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				c.spans = append(c.spans, ss.Spans...)
			}
		}
		c.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
		w.Write(out)
	}))
	t.Cleanup(srv.Close)
	return c, srv.URL
}

// The trace of a buy: the request's span, and under it, in the same trace,
// the stock script in Redis and the order's statements in MySQL. Spans are
// sent when the instance stops (the exporter flushes). A background
// command (the sweeper's, every 500 ms here) starts no trace of its own.
// Without the endpoint nothing is exported: the first case.
func TestTracesOfABuy(t *testing.T) {
	for _, on := range []bool{false, true} {
		name := map[bool]string{false: "off", true: "on"}[on]
		t.Run(name, func(t *testing.T) {
			col, url := startCollector(t)
			st := newStack(t, 0)
			var extra []string
			if on {
				extra = []string{"OTEL_EXPORTER_OTLP_ENDPOINT", url, "OTEL_SERVICE_NAME", "seckill-test"}
			}
			in := start(t, st.env(freeAddr(t), extra...))
			admin, _ := mustLogin(t, in.Base, adminPhone)
			vid := openVoucher(t, in.Base, admin, 5)
			token, _ := mustLogin(t, in.Base, "13900000001")
			if r := mustCall(t, "POST", in.Base+"/seckill/"+vid, token, nil); r.Status != http.StatusOK {
				t.Fatalf("buy: %d %s", r.Status, r.Code())
			}
			if err := in.Stop(); err != nil {
				t.Fatal(err)
			}
			col.mu.Lock()
			defer col.mu.Unlock()
			if !on {
				if col.posts != 0 {
					t.Fatalf("tracing off, yet %d exports reached the collector", col.posts)
				}
				return
			}
			var buy *tracepb.Span
			for _, s := range col.spans {
				if s.Kind == tracepb.Span_SPAN_KIND_SERVER && strings.Contains(s.Name, "/seckill/") {
					buy = s
				}
			}
			if buy == nil {
				t.Fatalf("no server span of POST /seckill/:id among %d spans: %v", len(col.spans), names(col.spans))
			}
			var redisSpan, mysqlSpan bool
			for _, s := range col.spans {
				if !bytes.Equal(s.TraceId, buy.TraceId) {
					if s.Kind != tracepb.Span_SPAN_KIND_SERVER && len(s.ParentSpanId) == 0 {
						t.Errorf("a trace began with %q, not with a request", s.Name)
					}
					continue
				}
				redisSpan = redisSpan || strings.EqualFold(s.Name, "evalsha")
				mysqlSpan = mysqlSpan || (strings.HasPrefix(s.Name, "sql.") && hasAttr(s, "INSERT INTO"))
			}
			t.Logf("%d spans: %v", len(col.spans), names(col.spans))
			if !redisSpan || !mysqlSpan {
				t.Errorf("the buy's trace: Redis script span %v, MySQL INSERT span %v; spans: %v", redisSpan, mysqlSpan, names(col.spans))
			}
		})
	}
}

func names(spans []*tracepb.Span) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name)
	}
	return out
}

// hasAttr reports whether an attribute of s has a string value containing
// sub (the statement of a MySQL span).
func hasAttr(s *tracepb.Span, sub string) bool {
	for _, a := range s.Attributes {
		if strings.Contains(a.GetValue().GetStringValue(), sub) {
			return true
		}
	}
	return false
}
