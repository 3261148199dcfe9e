//go:build linux

// Command openloop is the project's open-loop load generator: it sends
// requests at a fixed rate whatever the server answers, and times each one
// from when it was due, not from when it was written (wrk2's rule), so
// that the tail it reports is what a buyer waits for. A closed loop (wrk,
// a pool of clients each waiting for its answer) sends less while the
// server stalls and so never times the requests that would have arrived
// meanwhile: "coordinated omission". loadtest/tail.sh measures every path
// with it.
//
//	openloop -url http://127.0.0.1:18100/seckill/3 -method POST -rate 10000 \
//	  -duration 10s -warmup 2s -conns 128 -tokens /tmp/tokens.txt -json
//
// Request i is due at start + i/rate. A keep-alive connection, once free,
// takes the next request due, writes it and waits for the answer. A
// request due while every connection waits for an answer goes out late on
// the first one free and still counts from its due time (the report counts
// the late ones). Requests are rendered to bytes before the run; the
// connections are non-blocking sockets that an event loop (epoll, as in
// wrk) writes and reads by hand, sleeping to the microsecond until the
// next request is due. The standard HTTP client could not send more than
// about 10,000 requests a second on the project's 2-core machine while
// sharing it with the server; a goroutine a connection sent 40,000 but
// cost 14-24 µs of CPU a request, the loop 11-14 (Linux only).
//
// With -tokens, request i carries "Authorization: Bearer" and the file's
// token i (one a line, as loadtest/tokens writes them), round the file, so
// that requests come from many users; with -unique too, no token is sent
// twice (a user per request, as for orders), and a file with fewer tokens
// than requests is refused.
//
// It reports the requests due after the warm-up: how many were sent,
// answered and late, the rate achieved, statuses and errors, and the
// latency percentiles p50, p90, p99, p99.9 and the maximum, exact (nearest
// rank over every answer's latency, each measured to the nanosecond), as a
// line of text or, with -json, one JSON object. Errors (no answer) have no
// latency and are counted apart. The send lag, from due to the write, is
// the part of each latency spent before the server saw the request: the
// wait for a free connection (those requests are counted as queued) and
// the generator's own lateness (on a loaded machine its wake-ups come
// late). A tail of the lag near the latency's with few queued says the
// figure is the generator's or the machine's, not the server's.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "openloop:", err)
		os.Exit(1)
	}
}

// headerFlags collects repeated -H flags.
type headerFlags []string

func (h *headerFlags) String() string { return strings.Join(*h, ", ") }
func (h *headerFlags) Set(v string) error {
	name, _, ok := strings.Cut(v, ":")
	if !ok || strings.TrimSpace(name) == "" {
		return fmt.Errorf("header %q: want \"Name: value\"", v)
	}
	*h = append(*h, v)
	return nil
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("openloop", flag.ContinueOnError)
	target := fs.String("url", "", "the URL every request goes to (http only)")
	method := fs.String("method", "GET", "request method")
	rate := fs.Float64("rate", 0, "requests a second (required)")
	duration := fs.Duration("duration", 10*time.Second, "the measured window, after the warm-up")
	warmup := fs.Duration("warmup", 2*time.Second, "sent at the same rate first and not counted")
	conns := fs.Int("conns", 64, "keep-alive connections")
	loops := fs.Int("loops", 1, "event loops (threads) sharing the connections")
	var headers headerFlags
	fs.Var(&headers, "H", `a header, "Name: value" (repeatable)`)
	body := fs.String("body", "", "request body; @file reads it from file")
	tokens := fs.String("tokens", "", "file of bearer tokens, one a line, sent in turn (request i: token i, round the file)")
	unique := fs.Bool("unique", false, "with -tokens: no token twice (a user per request); fewer tokens than requests is an error")
	timeout := fs.Duration("timeout", 10*time.Second, "the most a request waits for its answer (an error past it)")
	late := fs.Duration("late", time.Millisecond, "a request written later than this after it was due counts as late")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *rate <= 0 || math.IsInf(*rate, 0) || *duration <= 0 || *warmup < 0 || *conns <= 0 || *loops <= 0 || *timeout <= 0 {
		return errors.New("-rate, -duration, -conns, -loops and -timeout must be positive, -warmup not negative")
	}
	if *unique && *tokens == "" {
		return errors.New("-unique needs -tokens")
	}
	u, err := url.Parse(*target)
	if err != nil || u.Scheme != "http" || u.Host == "" {
		return fmt.Errorf("-url %q: want http://host:port/path", *target)
	}
	payload := []byte(*body)
	if name, ok := strings.CutPrefix(*body, "@"); ok {
		if payload, err = os.ReadFile(name); err != nil {
			return err
		}
	}
	var toks []string
	if *tokens != "" {
		if toks, err = readTokens(*tokens); err != nil {
			return err
		}
	}

	p := &plan{
		addr: hostPort(u), head: strings.EqualFold(*method, "HEAD"),
		rate: *rate, warmup: *warmup, duration: *duration, conns: *conns, loops: *loops, timeout: *timeout, late: *late,
	}
	if *unique && int64(len(toks)) < p.count() {
		return fmt.Errorf("-unique: %d tokens in %s for %d requests (rate × (warm-up + duration))", len(toks), *tokens, p.count())
	}
	p.requests = render(strings.ToUpper(*method), u, headers, payload, toks)
	o, err := p.run(ctx)
	if err != nil {
		return err
	}
	rep := newReport(*method, u.String(), p, o)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		return enc.Encode(rep)
	}
	_, err = fmt.Fprintln(stdout, rep.line())
	return err
}

// readTokens reads a file of tokens, one a line, blank lines skipped.
func readTokens(name string) ([]string, error) {
	data, err := os.ReadFile(name)
	if err != nil {
		return nil, err
	}
	var toks []string
	for line := range strings.Lines(string(data)) {
		if t := strings.TrimSpace(line); t != "" {
			toks = append(toks, t)
		}
	}
	if len(toks) == 0 {
		return nil, fmt.Errorf("no tokens in %s", name)
	}
	return toks, nil
}

// hostPort is the address to dial for u: its port, or 80.
func hostPort(u *url.URL) string {
	if u.Port() != "" {
		return u.Host
	}
	return u.Host + ":80"
}

// render builds every request the run cycles through, as bytes: one, or
// one per token. Each is written whole with a single write, so that the
// loop does nothing per request but the write, the read and the clock.
func render(method string, u *url.URL, headers []string, body []byte, tokens []string) [][]byte {
	var head bytes.Buffer
	fmt.Fprintf(&head, "%s %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: seckill-openloop\r\n", method, u.RequestURI(), u.Host)
	for _, h := range headers {
		name, value, _ := strings.Cut(h, ":")
		fmt.Fprintf(&head, "%s: %s\r\n", strings.TrimSpace(name), strings.TrimSpace(value))
	}
	if len(body) > 0 || method == "POST" || method == "PUT" || method == "PATCH" {
		fmt.Fprintf(&head, "Content-Length: %d\r\n", len(body))
	}
	if len(tokens) == 0 {
		return [][]byte{slices.Concat(head.Bytes(), []byte("\r\n"), body)}
	}
	reqs := make([][]byte, len(tokens))
	for i, t := range tokens {
		reqs[i] = slices.Concat(head.Bytes(), []byte("Authorization: Bearer "+t+"\r\n\r\n"), body)
	}
	return reqs
}

// report is what a run prints, as JSON or as one line.
type report struct {
	Method      string  `json:"method"`
	URL         string  `json:"url"`
	Rate        float64 `json:"rate"`       // asked for, requests a second
	Duration    float64 `json:"duration_s"` // the measured window
	Warmup      float64 `json:"warmup_s"`
	Connections int     `json:"connections"`
	Due         int     `json:"due"`      // requests due in the window
	Sent        int     `json:"sent"`     // of those, written
	Answered    int     `json:"answered"` // of those, answered (any status)
	Achieved    float64 `json:"achieved_rate"`
	Late        int     `json:"late"` // written more than late_after_ms after due
	// Queued were due while every connection was busy and waited for one
	// (the server's answers, not the generator's pace): more -conns, or a
	// server at its limit.
	Queued      int            `json:"queued"`
	LateAfterMS float64        `json:"late_after_ms"`
	Unsent      int            `json:"unsent"`
	Statuses    map[string]int `json:"statuses"`
	Errors      map[string]int `json:"errors"`
	// GivenUp is the requests timed out or never sent, counted in Latency
	// at the time they were given up: above zero, the percentiles they
	// reach are lower bounds.
	GivenUp int       `json:"given_up"`
	Latency latencies `json:"latency_ms"`
	// SendLag is from due to the write, part of every latency above: the
	// wait for a free connection (see Queued) and the generator's own
	// lateness. A tail near the latency's with few queued says the figure
	// is the generator's (or the machine's), not the server's.
	SendLag latencies `json:"send_lag_ms"`
}

// latencies are milliseconds from when each request was due to its whole
// answer, nearest-rank percentiles of every answer in the window and of
// every request given up (GivenUp), at the time it was given up.
type latencies struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p99.9"`
	Max  float64 `json:"max"`
	Mean float64 `json:"mean"`
}

func newReport(method, target string, p *plan, o *outcome) report {
	r := report{
		Method: strings.ToUpper(method), URL: target, Rate: p.rate,
		Duration: p.duration.Seconds(), Warmup: p.warmup.Seconds(), Connections: p.conns,
		Due:  int(p.count() - p.firstMeasured()),
		Sent: o.sent, Late: o.late, Queued: o.queued, LateAfterMS: ms(p.late), Unsent: o.unsent,
		Statuses: map[string]int{}, Errors: o.errors, GivenUp: o.errors["timeout"] + o.unsent,
	}
	for s, n := range o.statuses {
		r.Statuses[strconv.Itoa(s)] = n
		r.Answered += n
	}
	// Answers over the span from the first measured request's due time
	// to the last answer: the rate the server kept up with.
	if span := o.lastAnswer.Sub(o.window); r.Answered > 0 && span > 0 {
		r.Achieved = float64(r.Answered) / span.Seconds()
	}
	r.Latency, r.SendLag = summarize(o.latencies), summarize(o.lags)
	return r
}

// summarize is the percentiles, maximum and mean of sorted, in ms.
func summarize(sorted []time.Duration) latencies {
	if len(sorted) == 0 {
		return latencies{}
	}
	var sum time.Duration
	for _, d := range sorted {
		sum += d
	}
	return latencies{
		P50: ms(percentile(sorted, 50)), P90: ms(percentile(sorted, 90)), P99: ms(percentile(sorted, 99)),
		P999: ms(percentile(sorted, 99.9)), Max: ms(sorted[len(sorted)-1]), Mean: ms(sum / time.Duration(len(sorted))),
	}
}

// percentile is the nearest-rank percentile q (0 < q <= 100) of sorted:
// the smallest value that at least q% of them do not exceed.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	// In whole numbers, thousandths of a percent: a float rank rounds up
	// a whole rank now and then (99.9% of 1,000 is 999.0000000000001).
	n, q1000 := int64(len(sorted)), int64(math.Round(q*1000))
	k := (q1000*n + 100_000 - 1) / 100_000
	return sorted[min(max(k, 1), n)-1]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// line is the report as one line of text.
func (r report) line() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s at %.0f/s for %gs (warm-up %gs, %d conns): %d due, %d sent, %d answered, %.0f/s achieved, %d late (>%gms), %d queued for a connection, %d unsent; statuses",
		r.Method, r.URL, r.Rate, r.Duration, r.Warmup, r.Connections, r.Due, r.Sent, r.Answered, r.Achieved, r.Late, r.LateAfterMS, r.Queued, r.Unsent)
	b.WriteString(counts(r.Statuses))
	if len(r.Errors) > 0 {
		b.WriteString("; errors")
		b.WriteString(counts(r.Errors))
	}
	l := r.Latency
	fmt.Fprintf(&b, "; latency ms p50 %.2f p90 %.2f p99 %.2f p99.9 %.2f max %.2f mean %.2f", l.P50, l.P90, l.P99, l.P999, l.Max, l.Mean)
	if r.GivenUp > 0 {
		fmt.Fprintf(&b, " (with %d given up, counted when given up: lower bounds)", r.GivenUp)
	}
	g := r.SendLag
	fmt.Fprintf(&b, "; send lag ms p50 %.2f p99 %.2f p99.9 %.2f max %.2f", g.P50, g.P99, g.P999, g.Max)
	return b.String()
}

// counts is " key:n key:n", keys in order.
func counts(m map[string]int) string {
	if len(m) == 0 {
		return " none"
	}
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(m)) {
		fmt.Fprintf(&b, " %s:%d", k, m[k])
	}
	return b.String()
}
