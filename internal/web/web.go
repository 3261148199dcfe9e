// Package web holds the HTTP plumbing every feature's handlers share: the
// error envelope of the contract, panic recovery, the body size limit,
// JSON bodies (under application/json only), and parsing of numeric path
// IDs. Handlers stay thin: bind, call the service, then Error or JSON.
//
// Every error answer goes out through this package, which records its
// code in the request's context: Answer reads it, so that whoever counts
// answers by outcome (packages metrics and live) learns it from the code
// the handler answered, not by mapping the status back to a code
// (sold_out and already_ordered are both 409).
package web

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/gin-gonic/gin"

	"seckill/internal/apperr"
)

// MaxBody is the largest request body accepted; larger ones get 413.
const MaxBody = 1 << 20

// Error answers err in the contract's envelope. Errors that are not an
// *apperr.Error are logged once, with their cause, and answered as a
// generic internal error: the client never sees internal detail. An error
// made with apperr.RetryAfter also gets a Retry-After header.
func Error(c *gin.Context, log *slog.Logger, err error) {
	// Most answers of a sale's flood (sold_out, already_ordered, and
	// not_started, ended, not_admitted) are bare sentinels: no chain to
	// search for a cancellation or a Retry-After (which wrap them; the
	// rate's busy is one of those, and goes the long way), and nothing to
	// log. Answered at once, they skip three searches of the chain by
	// reflection (errors.Is, errors.As twice).
	if e, ok := err.(*apperr.Error); ok && e != nil && e.Code != apperr.Unavailable {
		abort(c, apperr.Status(e.Code), e.Code, e.Message)
		return
	}
	e := apperr.As(err)
	switch {
	case errors.Is(err, context.Canceled) && c.Request.Context().Err() != nil:
		// The client went away (whatever wrapped the cancellation on its
		// way up): nobody will read the answer, and no store is down, so
		// it is no warning.
		log.DebugContext(c.Request.Context(), "client went away", "path", c.FullPath(), "err", err)
		e = apperr.New(apperr.Unavailable, "request cancelled")
	case e != nil && e.Code == apperr.Unavailable:
		log.WarnContext(c.Request.Context(), "unavailable", "path", c.FullPath(), "err", err)
	case e == nil:
		log.ErrorContext(c.Request.Context(), "internal error", "path", c.FullPath(), "err", err)
		e = apperr.New(apperr.Internal, "internal error")
	}
	if after, ok := apperr.RetryAfterOf(err); ok {
		c.Header("Retry-After", strconv.Itoa(retrySeconds(after)))
	}
	abort(c, apperr.Status(e.Code), e.Code, e.Message)
}

// retrySeconds is after as the Retry-After header writes it: whole
// seconds (RFC 9110 allows no fractions), rounded up, and at least 1. A
// client told 0, or told to come back a fraction of a second too early,
// retries at once and meets the same refusal.
func retrySeconds(after time.Duration) int {
	s := int((after + time.Second - 1) / time.Second)
	return max(s, 1)
}

// abort answers the envelope {"error": {"code": ..., "message": ...}}.
// It is written by hand, not by encoding/json: after a sale every answer
// is one of these, and reflecting over the envelope cost the sold-out path
// a few percent of its time.
func abort(c *gin.Context, status int, code apperr.Code, msg string) {
	b := make([]byte, 0, 48+len(code)+len(msg))
	b = append(b, `{"error":{"code":`...)
	b = appendString(b, string(code))
	b = append(b, `,"message":`...)
	b = appendString(b, msg)
	b = append(b, "}}"...)
	c.Set(answerKey, code)
	c.Abort()
	// What gin's c.Data does, without what it costs: its Content-Type
	// is a slice allocated per call (this one is shared: net/http only
	// reads it), and its Content-Length a header set by name, which
	// canonicalises the name and allocates the number. net/http writes
	// the same Content-Length itself, from its own buffer, for an answer
	// that fits that buffer (2 KiB) and is whole when the handler
	// returns, as the envelopes of the hot paths are. A longer one (a
	// message that echoes what the client sent) gets its length here, so
	// that no envelope goes out chunked.
	h := c.Writer.Header()
	if len(h["Content-Type"]) == 0 {
		h["Content-Type"] = jsonType
	}
	if len(b) > 2048 {
		h["Content-Length"] = []string{strconv.Itoa(len(b))}
	}
	c.Writer.WriteHeader(status)
	if _, err := c.Writer.Write(b); err != nil {
		_ = c.Error(err) // as c.Data records it, for the trace's span
	}
}

// jsonType is the Content-Type of every envelope. Never changed: it is
// shared by every answer's header map.
var jsonType = []string{"application/json; charset=utf-8"}

// appendString appends s as a JSON string: quotes, backslashes and
// control characters escaped, invalid UTF-8 replaced by U+FFFD (as
// encoding/json does), everything else as is.
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		case c >= utf8.RuneSelf:
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				b = append(b, `\ufffd`...)
			} else {
				b = append(b, s[i:i+size]...)
			}
			i += size
			continue
		default:
			b = append(b, c)
		}
		i++
	}
	return append(b, '"')
}

// answerKey is where abort records the code of the error it answered.
const answerKey = "web.answer"

// Answer names the answer c got, once it is written: "ok" for a 200, else
// the code of the contract it was answered with ("sold_out", "busy", ...),
// or "internal" for an error answered by something else than this
// package.
func Answer(c *gin.Context) string {
	if c.Writer.Status() == http.StatusOK {
		return "ok"
	}
	if code, ok := c.Get(answerKey); ok {
		return string(code.(apperr.Code))
	}
	return string(apperr.Internal)
}

// An Observer is told of every answer to a route Observe watches: c,
// the answer's name (Answer), and how long the request took from Observe
// on.
type Observer func(c *gin.Context, answer string, took time.Duration)

// Observe is a middleware that tells each of observers of every answer to
// route (gin's pattern, such as "/seckill/:voucherId"); other routes pass
// through. The buy button has two watchers (packages metrics and live):
// one middleware for both reads the clock twice a request, not four
// times, and looks the answer up once (a clock read was about 30 ns of
// the sold-out answer's chain of 2 µs).
func Observe(route string, observers ...Observer) gin.HandlerFunc {
	return func(c *gin.Context) {
		if c.FullPath() != route {
			c.Next()
			return
		}
		start := time.Now()
		c.Next()
		took, answer := time.Since(start), Answer(c)
		for _, o := range observers {
			o(c, answer, took)
		}
	}
}

// JSON writes v with the given status.
func JSON(c *gin.Context, status int, v any) { c.JSON(status, v) }

// BindJSON decodes the body, a single JSON value sent as
// application/json, into v, answering unsupported_media_type (415) or
// invalid_argument (or 413 for a body over MaxBody) itself when it
// cannot. It reports whether the handler should go on.
func BindJSON(c *gin.Context, v any) bool {
	if !isJSON(c.Request) {
		abort(c, http.StatusUnsupportedMediaType, apperr.UnsupportedMediaType, mustBeJSON)
		return false
	}
	body, ok := Body(c)
	if !ok {
		return false
	}
	// json.Unmarshal, unlike a Decoder, refuses anything after the value.
	if json.Unmarshal(body, v) != nil {
		abort(c, http.StatusBadRequest, apperr.InvalidArgument, "request body must be one JSON object of the documented shape")
		return false
	}
	return true
}

// Body reads the request's body, answering 413 (over MaxBody), 415 (a
// body under another Content-Type than application/json: every body of
// the contract is JSON) or 400 itself when it cannot. An empty body needs
// no Content-Type, for the routes whose body is optional. It reports
// whether the handler should go on.
func Body(c *gin.Context) ([]byte, bool) {
	body, err := io.ReadAll(c.Request.Body)
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		abort(c, http.StatusRequestEntityTooLarge, apperr.InvalidArgument, "request body is larger than 1 MiB")
		return nil, false
	}
	if err != nil {
		abort(c, http.StatusBadRequest, apperr.InvalidArgument, "request body could not be read")
		return nil, false
	}
	if len(body) > 0 && !isJSON(c.Request) {
		abort(c, http.StatusUnsupportedMediaType, apperr.UnsupportedMediaType, mustBeJSON)
		return nil, false
	}
	return body, true
}

const mustBeJSON = "send the request body as Content-Type: application/json"

// isJSON reports whether r says its body is JSON: Content-Type
// application/json, once, in any case, with parameters or none, but no
// charset other than UTF-8 (RFC 8259: JSON exchanged between systems is
// UTF-8).
//
// Why it matters: a browser sends a page's cross-site POST without
// asking the server first (no CORS preflight) only as a "simple request",
// whose Content-Type is text/plain, a form or multipart. A server that
// reads JSON under any type lets any web page make its visitors' browsers
// post to it (to /auth/code and /auth/login: a crowd of unwitting code
// requests and guesses); one that insists on application/json does not,
// as the browser must ask first and this server answers no CORS.
func isJSON(r *http.Request) bool {
	types := r.Header["Content-Type"]
	if len(types) != 1 { // none, or two: which one counts would depend on who reads it
		return false
	}
	ct := types[0]
	if ct == "application/json" {
		return true
	}
	typ, params, err := mime.ParseMediaType(ct)
	if err != nil || typ != "application/json" {
		return false
	}
	cs, ok := params["charset"]
	return !ok || strings.EqualFold(cs, "utf-8")
}

// ID parses the path parameter name as a positive 64-bit ID written in
// decimal digits only (no sign, no spaces).
func ID(c *gin.Context, name string) (int64, bool) {
	p := c.Param(name)
	id, err := strconv.ParseInt(p, 10, 64)
	if err != nil || id <= 0 || p[0] < '0' || p[0] > '9' {
		abort(c, http.StatusBadRequest, apperr.InvalidArgument, name+" must be a positive decimal integer")
		return 0, false
	}
	return id, true
}

// BodyTimeout is how long a request's body may take to arrive, from the
// moment ReadBody starts to read it. The contract's bodies are a few
// hundred bytes that arrive with the headers: seconds are generous.
const BodyTimeout = 3 * time.Second

// SmallBody is the largest body read before the cap on requests in
// flight (see ReadBody): far above any body of the contract, small
// enough that the connections one address may hold (admission.Conns) can
// buffer only megabytes of it.
const SmallBody = 16 << 10

// bodyRead marks a request whose body ReadBody has read.
const bodyRead = "web.bodyRead"

// ReadBody reads the request's whole body before the request goes on,
// under a deadline of its own (timeout: BodyTimeout but in tests), if
// its declared length is at most upTo; it refuses bodies over MaxBody
// (413, from a declared Content-Length before reading).
//
// The server uses it twice, around the cap on requests in flight
// (package admission): first with SmallBody, then with MaxBody. A client
// that sends its headers and then trickles its body in, a byte now and
// then, would otherwise hold a slot while it trickles, and a few hundred
// such clients held them all. Only a body declared larger than SmallBody,
// or of no declared length (chunked), is read once the request holds a
// slot, for at most timeout: reading every body before the cap would
// instead let a few addresses hold a megabyte per connection, with no
// bound but memory.
func ReadBody(timeout time.Duration, upTo int64) gin.HandlerFunc {
	late := fmt.Sprintf("request body did not arrive whole within %s", timeout)
	return func(c *gin.Context) {
		r := c.Request
		if r.ContentLength > MaxBody {
			abort(c, http.StatusRequestEntityTooLarge, apperr.InvalidArgument, "request body is larger than 1 MiB")
			return
		}
		if _, done := c.Get(bodyRead); done || r.Body == nil || r.Body == http.NoBody || r.ContentLength > upTo || (r.ContentLength < 0 && upTo < MaxBody) {
			c.Next()
			return
		}
		rc := http.NewResponseController(c.Writer)
		// Not supported by a test's recorder: then the server's
		// ReadTimeout alone bounds the read, as it would anyway.
		_ = rc.SetReadDeadline(time.Now().Add(timeout))
		body, err := io.ReadAll(http.MaxBytesReader(c.Writer, r.Body, MaxBody))
		var tooBig *http.MaxBytesError
		switch {
		case errors.As(err, &tooBig):
			abort(c, http.StatusRequestEntityTooLarge, apperr.InvalidArgument, "request body is larger than 1 MiB")
			return
		case err != nil:
			// The connection is closed after the answer: what is left
			// of the body is not waited for (the deadline stays).
			c.Header("Connection", "close")
			abort(c, http.StatusBadRequest, apperr.InvalidArgument, late)
			return
		}
		// No deadline once the body is in: the server reads on in the
		// background to notice a client that hangs up, and a deadline
		// passing there would cancel the request's context mid-work.
		_ = rc.SetReadDeadline(time.Time{})
		r.Body = io.NopCloser(bytes.NewReader(body))
		c.Set(bodyRead, true)
		c.Next()
	}
}

// Recover turns a panic into a logged internal error, so no panic reaches
// a client as a dropped connection or a stack trace.
func Recover(log *slog.Logger) gin.HandlerFunc {
	return func(c *gin.Context) {
		defer func() {
			if r := recover(); r != nil {
				if r == http.ErrAbortHandler {
					panic(r)
				}
				log.ErrorContext(c.Request.Context(), "panic", "path", c.FullPath(), "panic", r)
				abort(c, http.StatusInternalServerError, apperr.Internal, "internal error")
			}
		}()
		c.Next()
	}
}

// NotFound answers unknown routes in the envelope.
func NotFound(c *gin.Context) {
	abort(c, http.StatusNotFound, apperr.NotFound, "no such endpoint")
}

// Harden sets the headers every answer carries, and refuses a request
// that names its credentials twice.
//
//   - X-Content-Type-Options: nosniff: a browser takes each answer for
//     the type it says (JSON stays JSON, never HTML that runs).
//   - X-Frame-Options: DENY, and a Content-Security-Policy of
//     frame-ancestors 'none' (the live page sets a fuller policy of its
//     own, with the same rule): no other site shows a page of this server
//     in a frame and tricks its user into clicking it.
//   - Referrer-Policy: no-referrer: a link followed from the live page
//     does not tell the next site which voucher it was watching.
//
// Two Authorization headers are a client's mistake or a proxy's
// injection: which one counts would depend on who reads them (the first
// won), so neither does: 400.
func Harden() gin.HandlerFunc {
	// The keys are canonical already and the values never change: set as
	// map entries, on every request of the hot path, they cost no
	// canonicalising and no allocation of their own. A list, not a map:
	// ranging over a map starts at a random place and walks its table,
	// which cost more than the four assignments.
	headers := [...]struct {
		key    string
		values []string
	}{
		{"X-Content-Type-Options", []string{"nosniff"}},
		{"X-Frame-Options", []string{"DENY"}},
		{"Content-Security-Policy", []string{"frame-ancestors 'none'"}},
		{"Referrer-Policy", []string{"no-referrer"}},
	}
	return func(c *gin.Context) {
		h := c.Writer.Header()
		for _, kv := range headers {
			h[kv.key] = kv.values
		}
		// Indexed by its canonical name, as Header.Values would after
		// canonicalising it again on every request.
		if len(c.Request.Header["Authorization"]) > 1 {
			abort(c, http.StatusBadRequest, apperr.InvalidArgument, "send one Authorization header, not several")
			return
		}
		c.Next()
	}
}

// keysPool holds the maps of values gin keeps per request (c.Keys, what
// c.Set and c.Get use), for ReuseKeys.
var keysPool = sync.Pool{New: func() any { return make(map[any]any, 4) }}

// ReuseKeys gives each request a map for c.Set from a pool, and gives it
// back, emptied, when the request is done. gin makes a fresh map on a
// request's first c.Set (the token's identity, the answer's code: every
// buy request sets both), about 300 bytes for the garbage collector on
// every answer of a sale's flood; the pool makes it a few nanoseconds.
//
// It must come first, before any middleware that calls c.Set. It is as
// safe as gin itself: gin reuses the whole Context once the request is
// done, so nothing may keep c past it anyway (gin's c.Copy, the way to
// hand a request to a goroutine, copies the map).
func ReuseKeys() gin.HandlerFunc {
	return func(c *gin.Context) {
		if c.Keys != nil { // set before us: leave it be
			c.Next()
			return
		}
		keys := keysPool.Get().(map[any]any)
		c.Keys = keys
		c.Next()
		// Not deferred: a panic that gets this far (Recover passes
		// http.ErrAbortHandler on) leaves the map to the garbage
		// collector, as gin's own would be.
		c.Keys = nil
		clear(keys)
		keysPool.Put(keys)
	}
}
