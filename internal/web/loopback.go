package web

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
)

// Loopback is how a server's own background work calls the server's
// router as a client would, through every middleware, without a network:
// the live page's simulated crowd (package live) and the fake payment
// provider (package payment). The router is built after the work that
// calls it, so it is named later (SetTarget). Close ends the work and
// waits for it, before the server shuts down: calls that go to the router
// directly are neither refused nor waited for by the HTTP server's
// Shutdown.
type Loopback struct {
	target atomic.Pointer[http.Handler]
	ctx    context.Context
	stop   context.CancelFunc
	wg     sync.WaitGroup
}

// NewLoopback returns a Loopback with no target yet.
func NewLoopback() *Loopback {
	l := &Loopback{}
	l.ctx, l.stop = context.WithCancel(context.Background())
	return l
}

// SetTarget names the handler the calls go to: the server's router.
func (l *Loopback) SetTarget(h http.Handler) { l.target.Store(&h) }

// Ready reports whether a target is set.
func (l *Loopback) Ready() bool { return l.target.Load() != nil }

// Context ends when Close is called.
func (l *Loopback) Context() context.Context { return l.ctx }

// Go runs fn in the background; Close waits for it.
func (l *Loopback) Go(fn func()) { l.wg.Go(fn) }

// Close ends the Context and waits for what Go started.
func (l *Loopback) Close() {
	l.stop()
	l.wg.Wait()
}

// Serve sends req to the target and returns the answer, nil if no target
// is set. The request comes from 127.0.0.1, as the server's own.
func (l *Loopback) Serve(req *http.Request) *httptest.ResponseRecorder {
	h := l.target.Load()
	if h == nil {
		return nil
	}
	req.RemoteAddr = "127.0.0.1:1"
	rec := httptest.NewRecorder()
	(*h).ServeHTTP(rec, req)
	return rec
}
