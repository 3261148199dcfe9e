package web

import (
	"net/http"
	"time"

	"github.com/gin-gonic/gin"
)

// Stream is an answer of server-sent events (the live page's figures, a
// waiting room's place): each event written and flushed as it comes.
type Stream struct {
	rc *http.ResponseController
	w  gin.ResponseWriter
}

// OpenStream answers c with a stream of events: its headers, and at once a
// first line that tells the client to reconnect after a second if the
// stream breaks (and shows it is connected before the first event).
func OpenStream(c *gin.Context) (*Stream, error) {
	c.Header("Content-Type", "text/event-stream")
	c.Header("Cache-Control", "no-store")
	c.Header("X-Accel-Buffering", "no") // nginx: pass each event on at once
	c.Status(http.StatusOK)
	s := &Stream{rc: http.NewResponseController(c.Writer), w: c.Writer}
	return s, s.Send([]byte("retry: 1000\n\n"))
}

// Send writes b, one or more events, and flushes it.
func (s *Stream) Send(b []byte) error {
	// The server's WriteTimeout counts from the request's start: each
	// event moves the deadline on, or the stream would be cut after it.
	s.rc.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := s.w.Write(b); err != nil {
		return err
	}
	return s.rc.Flush()
}
