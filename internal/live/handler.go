package live

import (
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"encoding/json"
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
// added by mistake. It replaces web.Harden's policy, so it says
// frame-ancestors 'none' again.
var pageCSP = func() string {
	s := string(page)
	start := strings.Index(s, "<script>") + len("<script>")
	end := strings.Index(s, "</script>")
	sum := sha256.Sum256([]byte(s[start:end]))
	return "default-src 'none'; connect-src 'self'; style-src 'unsafe-inline'; img-src data:; frame-ancestors 'none'; script-src 'sha256-" +
		base64.StdEncoding.EncodeToString(sum[:]) + "'"
}()

// Handler serves the live page, its events, and the crowd.
type Handler struct {
	src   *Source
	feeds *feeds
	crowd *Crowd // nil: LIVE_CROWD is off
	log   *slog.Logger
	done  <-chan struct{}
}

// NewHandler returns a Handler. crowd may be nil (no crowd button); done
// closes when the server shuts down, ending the event streams, which
// would otherwise keep the shutdown waiting for as long as a page is
// open.
func NewHandler(src *Source, crowd *Crowd, done <-chan struct{}, log *slog.Logger) *Handler {
	return &Handler{src: src, feeds: newFeeds(src.Read, done, log), crowd: crowd, done: done, log: log}
}

// PassStreams runs limit, the instance's cap on requests in flight, for
// every request but an event stream (GET on route, the route of Events in
// gin's pattern): a stream lasts as long as its page, and would hold a
// slot all that time. The streams are bounded by a cap of their own
// (MaxStreams). The page and the crowd are ordinary requests, under limit.
func PassStreams(route string, limit gin.HandlerFunc) gin.HandlerFunc {
	return func(c *gin.Context) {
		if c.Request.Method == http.MethodGet && c.FullPath() == route {
			c.Next()
			return
		}
		limit(c)
	}
}

// Page answers GET /live/{voucherId}: the page.
func (h *Handler) Page(c *gin.Context) {
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

// Events answers GET /live/{voucherId}/events: the page's figures, every
// second, as server-sent events.
func (h *Handler) Events(c *gin.Context) {
	// First, before the voucher is looked up: an open refused for its
	// rate costs nothing, whatever the ID.
	client := web.AddrKey(c.ClientIP())
	if err := h.feeds.opening(client); err != nil {
		web.Error(c, h.log, err)
		return
	}
	id, ok := web.ID(c, "voucherId")
	if !ok {
		return
	}
	ctx := c.Request.Context()
	if _, err := h.src.vouchers.Find(ctx, id); err != nil {
		web.Error(c, h.log, err)
		return
	}
	events, leave, err := h.feeds.join(id, client)
	if err != nil {
		web.Error(c, h.log, err)
		return
	}
	defer leave()
	// Opened at once, before the first event (up to a second and a bit
	// away when this stream starts its voucher's reader): the page shows
	// it is connected.
	stream, err := web.OpenStream(c)
	if err != nil {
		return
	}
	end := time.After(streamFor)
	for {
		select {
		case event := <-events:
			if stream.Send(event) != nil || last(event) {
				return // the client left, or the sale ended
			}
		case <-ctx.Done():
			return
		case <-h.done:
			return
		case <-end:
			return
		}
	}
}

// StartCrowd answers POST /live/{voucherId}/crowd (admins): a simulated
// crowd buys the voucher.
func (h *Handler) StartCrowd(c *gin.Context) {
	id, ok := web.ID(c, "voucherId")
	if !ok {
		return
	}
	if h.crowd == nil {
		web.Error(c, h.log, apperr.New(apperr.Forbidden, "the simulated crowd is off on this server (LIVE_CROWD=true turns it on)"))
		return
	}
	// The body is optional: none, or an empty one however sent (a
	// client may send even an empty body chunked, without a length),
	// asks for the defaults.
	body, ok := web.Body(c)
	if !ok {
		return
	}
	var in CrowdInput
	if len(body) > 0 && json.Unmarshal(body, &in) != nil {
		web.Error(c, h.log, apperr.Invalid("request body must be one JSON object of the documented shape"))
		return
	}
	if _, err := h.src.vouchers.Find(c.Request.Context(), id); err != nil {
		web.Error(c, h.log, err)
		return
	}
	st, err := h.crowd.Start(c.Request.Context(), id, in, h.src.reserveCrowd)
	if err != nil {
		web.Error(c, h.log, err)
		return
	}
	web.JSON(c, http.StatusAccepted, gin.H{"voucher": strconv.FormatInt(id, 10), "users": st.Users, "rate": st.Rate,
		"first_phone": crowdPhone(st.First), "last_phone": crowdPhone(st.First + st.Users - 1)})
}
