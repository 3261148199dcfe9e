// Package apperr names the outcomes the API reports to clients.
//
// Every feature declares its sentinel errors with a Code from this package
// (order.ErrSoldOut is an *Error with Code SoldOut), and the web layer turns
// any error into the contract's envelope with one table, Status. Features
// never speak HTTP, and the HTTP layer never needs to import features.
package apperr

import (
	"errors"
	"net/http"
	"time"
)

// Code is a machine-readable error code of the external contract.
type Code string

// The codes of the API reference, docs/api.md, in its order.
const (
	InvalidArgument      Code = "invalid_argument"
	UnsupportedMediaType Code = "unsupported_media_type"
	Unauthorized         Code = "unauthorized"
	Forbidden            Code = "forbidden"
	NotFound             Code = "not_found"
	NotStarted           Code = "not_started"
	Ended                Code = "ended"
	SoldOut              Code = "sold_out"
	AlreadyOrdered       Code = "already_ordered"
	NotAdmitted          Code = "not_admitted"
	InvalidState         Code = "invalid_state"
	UpgradePending       Code = "upgrade_pending"
	Busy                 Code = "busy"
	Unavailable          Code = "unavailable"
	Internal             Code = "internal"
)

// status is the one table from code to HTTP status.
var status = map[Code]int{
	InvalidArgument:      http.StatusBadRequest,
	UnsupportedMediaType: http.StatusUnsupportedMediaType,
	Unauthorized:         http.StatusUnauthorized,
	Forbidden:            http.StatusForbidden,
	NotFound:             http.StatusNotFound,
	NotStarted:           http.StatusConflict,
	Ended:                http.StatusConflict,
	SoldOut:              http.StatusConflict,
	AlreadyOrdered:       http.StatusConflict,
	NotAdmitted:          http.StatusConflict,
	InvalidState:         http.StatusConflict,
	UpgradePending:       http.StatusConflict,
	Busy:                 http.StatusTooManyRequests,
	Unavailable:          http.StatusServiceUnavailable,
	Internal:             http.StatusInternalServerError,
}

// Status is the HTTP status for code; unknown codes are 500.
func Status(code Code) int {
	if s, ok := status[code]; ok {
		return s
	}
	return http.StatusInternalServerError
}

// Error is an outcome a client may see. Its Message is written for the
// client, so it must never carry internal detail.
type Error struct {
	Code    Code
	Message string
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

// New returns a sentinel error; compare it with errors.Is.
func New(code Code, message string) *Error { return &Error{Code: code, Message: message} }

// Invalid returns an invalid_argument error with a message for the client.
func Invalid(message string) *Error { return New(InvalidArgument, message) }

// ErrUnavailable marks a failure to reach MySQL or Redis. Wrap the cause
// with Down so that logs keep it and clients see only this.
var ErrUnavailable = New(Unavailable, "a backing store is unreachable; nothing was taken, try again")

// Down wraps cause, a failure to reach MySQL or Redis, so that
// errors.Is(err, ErrUnavailable) holds and the cause is still there for the log.
func Down(cause error) error {
	if cause == nil {
		return nil
	}
	return errors.Join(ErrUnavailable, cause)
}

// As finds the client-facing error in err's chain. Anything else is
// reported as internal.
func As(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return nil
}

// retryAfter is an outcome that knows when trying again may succeed.
type retryAfter struct {
	err   error
	after time.Duration
}

func (r *retryAfter) Error() string { return r.err.Error() }
func (r *retryAfter) Unwrap() error { return r.err }

// RetryAfter returns err, usually a busy sentinel, with a hint of how long
// until the same request may succeed: a rate limit's window that has yet
// to end, a lock that has yet to expire. errors.Is(err, sentinel) still
// holds. The web layer sends the hint as a Retry-After header, so that a
// well-behaved client waits instead of hammering a limit it cannot pass.
func RetryAfter(err error, after time.Duration) error {
	if err == nil {
		return nil
	}
	return &retryAfter{err: err, after: after}
}

// RetryAfterOf returns the hint RetryAfter put in err's chain.
func RetryAfterOf(err error) (time.Duration, bool) {
	var r *retryAfter
	if errors.As(err, &r) {
		return r.after, true
	}
	return 0, false
}
