// Package tracing turns on OpenTelemetry tracing: a span for every HTTP
// request, and under it one for every Redis command and every MySQL
// statement it caused, exported over OTLP/HTTP to a collector (Jaeger,
// Tempo, the OpenTelemetry Collector).
//
// It is off unless an endpoint is configured, and then costs nothing: no
// middleware, no hooks, no tracer. A request's trace shows where its time
// went: the stock script, the lock, the transaction, and waits between
// them (a connection from a pool, a group commit).
package tracing

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/XSAM/otelsql"
	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/extra/redisotel/v9"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/contrib/instrumentation/github.com/gin-gonic/gin/otelgin"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	sdkresource "go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"
)

// Config says where spans go.
type Config struct {
	// Endpoint is the collector's base URL (OTEL_EXPORTER_OTLP_ENDPOINT,
	// e.g. http://collector:4318): spans are sent to Endpoint/v1/traces.
	// Empty: tracing is off.
	Endpoint string
	// Service names this service in the traces (OTEL_SERVICE_NAME).
	Service string
}

// CheckEndpoint reports whether endpoint is a URL the exporter can send
// to: http or https, with a host.
func CheckEndpoint(endpoint string) error {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("OTEL_EXPORTER_OTLP_ENDPOINT %q is not an http:// or https:// URL with a host (such as http://localhost:4318)", endpoint)
	}
	return nil
}

// Tracer traces one server: its requests, Redis and MySQL. The zero value
// (and nil) is tracing off.
type Tracer struct {
	provider *sdktrace.TracerProvider
}

// New starts exporting spans as cfg says, or returns nil if it says
// nothing (tracing off).
func New(cfg Config) (*Tracer, error) {
	if cfg.Endpoint == "" {
		return nil, nil
	}
	if err := CheckEndpoint(cfg.Endpoint); err != nil {
		return nil, err
	}
	exporter, err := otlptracehttp.New(context.Background(),
		otlptracehttp.WithEndpointURL(strings.TrimRight(cfg.Endpoint, "/")+"/v1/traces"))
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	res := sdkresource.NewSchemaless(semconv.ServiceName(cfg.Service))
	return &Tracer{provider: sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exporter), sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(requestsOnly{})),
	)}, nil
}

// requestsOnly starts a trace for every request (a server span) and for
// nothing else. The sweeper and the queue's consumers talk to Redis and
// MySQL on their own, dozens of times a second even when idle; each of
// those would otherwise be a trace of its own and bury the requests'.
// What happens within a request's trace is kept (ParentBased).
type requestsOnly struct{}

func (requestsOnly) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	ts := trace.SpanContextFromContext(p.ParentContext).TraceState()
	if p.Kind == trace.SpanKindServer {
		return sdktrace.SamplingResult{Decision: sdktrace.RecordAndSample, Tracestate: ts}
	}
	return sdktrace.SamplingResult{Decision: sdktrace.Drop, Tracestate: ts}
}

func (requestsOnly) Description() string { return "RequestsOnly" }

// propagator reads and writes the W3C traceparent header, so that a
// request's trace continues one its caller started.
var propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// Middleware starts a span for every request (nil: none).
func (t *Tracer) Middleware(service string) gin.HandlerFunc {
	if t == nil {
		return nil
	}
	return otelgin.Middleware(service, otelgin.WithTracerProvider(t.provider), otelgin.WithPropagators(propagator))
}

// Redis traces rdb's commands, as children of the request's span.
func (t *Tracer) Redis(rdb redis.UniversalClient) error {
	if t == nil {
		return nil
	}
	return redisotel.InstrumentTracing(rdb, redisotel.WithTracerProvider(t.provider))
}

// Provider is the tracer provider, for spans of one's own (nil: off).
func (t *Tracer) Provider() trace.TracerProvider {
	if t == nil {
		return nil
	}
	return t.provider
}

// Shutdown sends the spans not yet sent, within ctx.
func (t *Tracer) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	if err := t.provider.Shutdown(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("tracing: flush spans: %w", err)
	}
	return nil
}

// OpenMySQL opens a database/sql pool on the MySQL driver whose every
// statement and transaction is traced (otelsql wraps the driver, so the
// statements gorm makes and those made on the pool directly both count).
func (t *Tracer) OpenMySQL(dsn string) (*sql.DB, error) {
	return otelsql.Open("mysql", dsn, otelsql.WithTracerProvider(t.provider),
		otelsql.WithAttributes(semconv.DBSystemNameMySQL),
		// Spans for what a request waits on, not for each row read or
		// connection reset: those would drown the trace.
		otelsql.WithSpanOptions(otelsql.SpanOptions{OmitRows: true, OmitConnResetSession: true, OmitConnPrepare: true}))
}
