package live

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"seckill/internal/apperr"
	"seckill/internal/web"
)

//go:embed page.html
var page []byte

// pageCSP allows the page its own inline script (by its hash) and its own
// origin, nothing else: no script from a CDN could run even if one were
// added by mistake.
var pageCSP = func() string {
	s := string(page)
	start := strings.Index(s, "<script>") + len("<script>")
	end := strings.Index(s, "</script>")
	sum := sha256.Sum256([]byte(s[start:end]))
	return "default-src 'none'; connect-src 'self'; style-src 'unsafe-inline'; img-src data:; script-src 'sha256-" +
		base64.StdEncoding.EncodeToString(sum[:]) + "'"
}()

// Handler serves the live page, its events, and the crowd.
type Handler struct {
	src   *Source
	crowd *Crowd // nil: LIVE_CROWD is off
	log   *slog.Logger
	done  <-chan struct{}
}

// NewHandler returns a Handler. crowd may be nil (no crowd button); done
// closes when the server shuts down, ending the event streams, which
// would otherwise keep the shutdown waiting for as long as a page is
// open.
func NewHandler(src *Source, crowd *Crowd, done <-chan struct{}, log *slog.Logger) *Handler {
	return &Handler{src: src, crowd: crowd, done: done, log: log}
}

// Register adds the routes; admin guards the crowd, behind authn.
func (h *Handler) Register(r gin.IRouter, authn, admin gin.HandlerFunc) {
	r.GET("/live/:voucherId", h.page)
	r.GET("/live/:voucherId/events", h.events)
	r.POST("/live/:voucherId/crowd", authn, admin, h.startCrowd)
}

func (h *Handler) page(c *gin.Context) {
	id, ok := web.ID(c, "voucherId")
	if !ok {
		return
	}
	if _, err := h.src.vouchers.Find(c.Request.Context(), id); err != nil {
		web.Error(c, h.log, err)
		return
	}
	c.Header("Content-Security-Policy", pageCSP)
	c.Header("Cache-Control", "no-store")
	c.Data(http.StatusOK, "text/html; charset=utf-8", page)
}

// streamFor bounds one event stream: the browser's EventSource opens a new
// one by itself, so a tab left open does not hold a goroutine for days.
const streamFor = 10 * time.Minute

func (h *Handler) events(c *gin.Context) {
	id, ok := web.ID(c, "voucherId")
	if !ok {
		return
	}
	ctx := c.Request.Context()
	if _, err := h.src.vouchers.Find(ctx, id); err != nil {
		web.Error(c, h.log, err)
		return
	}
	c.Header("Content-Type", "text/event-stream")
	c.Header("Cache-Control", "no-store")
	c.Header("X-Accel-Buffering", "no") // nginx: pass each event on at once
	c.Status(http.StatusOK)
	rc := http.NewResponseController(c.Writer)
	io.WriteString(c.Writer, "retry: 1000\n\n")
	end := time.After(streamFor)
	for {
		if err := h.send(ctx, rc, c.Writer, id); err != nil {
			return // the client left
		}
		// Just after the next second begins, when every instance has
		// added the last second's answers.
		now := time.Now()
		wait := now.Truncate(time.Second).Add(time.Second + 300*time.Millisecond).Sub(now)
		select {
		case <-ctx.Done():
			return
		case <-h.done:
			return
		case <-end:
			return
		case <-time.After(wait):
		}
	}
}

// send writes one event: the figures, or an error event the page shows
// while the stream goes on.
func (h *Handler) send(ctx context.Context, rc *http.ResponseController, w io.Writer, id int64) error {
	rctx, cancel := context.WithTimeout(ctx, 900*time.Millisecond)
	f, err := h.src.Read(rctx, id)
	cancel()
	var event []byte
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		h.log.WarnContext(ctx, "live: read the sale", "voucher", id, "err", err)
		// The cause stays in the log: the page is public.
		event = []byte("event: trouble\ndata: {\"message\": \"cannot read the sale now: MySQL or Redis did not answer\"}\n\n")
	} else {
		data, _ := json.Marshal(f)
		event = append(append([]byte("event: figures\ndata: "), data...), "\n\n"...)
	}
	// The server's WriteTimeout counts from the request's start: each
	// event moves the deadline on, or the stream would be cut after it.
	rc.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := w.Write(event); err != nil {
		return err
	}
	return rc.Flush()
}

func (h *Handler) startCrowd(c *gin.Context) {
	id, ok := web.ID(c, "voucherId")
	if !ok {
		return
	}
	if h.crowd == nil {
		web.Error(c, h.log, apperr.New(apperr.Forbidden, "the simulated crowd is off on this server (LIVE_CROWD=true turns it on)"))
		return
	}
	var in CrowdInput
	if c.Request.ContentLength != 0 && !web.BindJSON(c, &in) {
		return
	}
	if _, err := h.src.vouchers.Find(c.Request.Context(), id); err != nil {
		web.Error(c, h.log, err)
		return
	}
	in, err := h.crowd.Start(id, in)
	if err != nil {
		web.Error(c, h.log, err)
		return
	}
	web.JSON(c, http.StatusAccepted, gin.H{"voucher": strconv.FormatInt(id, 10), "users": in.Users, "rate": in.Rate})
}
