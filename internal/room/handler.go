package room

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"seckill/internal/auth"
	"seckill/internal/web"
)

// Finder finds a voucher's room: nil and no error for a voucher without
// one; the voucher's own errors (not found) otherwise.
type Finder func(ctx context.Context, voucherID int64) (*Sale, error)

// Restocker puts a voucher's stock keys back after Redis lost them
// (package order's Restock).
type Restocker func(ctx context.Context, voucherID int64) error

// Handler serves a voucher's room: joining, the caller's place, and the
// place as a stream of events.
type Handler struct {
	store   *Store
	find    Finder
	restock Restocker
	obs     Observer
	feeds   *feeds
	log     *slog.Logger
	done    <-chan struct{}
}

// NewHandler returns a Handler. done closes when the server shuts down,
// ending the event streams.
func NewHandler(store *Store, find Finder, restock Restocker, obs Observer, done <-chan struct{}, log *slog.Logger) *Handler {
	return &Handler{store: store, find: find, restock: restock, obs: obs, feeds: newFeeds(store, log), done: done, log: log}
}

// sale finds the room of the request's voucher, or answers the error.
func (h *Handler) sale(c *gin.Context) (*Sale, bool) {
	id, ok := web.ID(c, "id")
	if !ok {
		return nil, false
	}
	sale, err := h.find(c.Request.Context(), id)
	if err == nil && sale == nil {
		err = ErrNoRoom
	}
	if err != nil {
		web.Error(c, h.log, err)
		return nil, false
	}
	return sale, true
}

// Join answers POST /vouchers/{id}/room: the caller joins the line (or
// keeps the place they hold), and is answered their place.
func (h *Handler) Join(c *gin.Context) {
	sale, ok := h.sale(c)
	if !ok {
		return
	}
	ctx, user := c.Request.Context(), auth.From(c).UserID
	joined, p, err := h.store.JoinPlace(ctx, *sale, user)
	if errors.Is(err, ErrStockMissing) {
		// Redis lost the voucher's keys: put the stock back from MySQL
		// (and the buyers with it), then join.
		if err = h.restock(ctx, sale.VoucherID); err == nil {
			joined, p, err = h.store.JoinPlace(ctx, *sale, user)
		}
	}
	if err != nil {
		web.Error(c, h.log, err)
		return
	}
	if joined && h.obs != nil {
		h.obs.Joined()
	}
	web.JSON(c, http.StatusOK, p)
}

// Place answers GET /vouchers/{id}/room: the caller's place.
func (h *Handler) Place(c *gin.Context) {
	sale, ok := h.sale(c)
	if !ok {
		return
	}
	h.answerPlace(c, sale, auth.From(c).UserID)
}

func (h *Handler) answerPlace(c *gin.Context, sale *Sale, user int64) {
	snap, err := h.read(c.Request.Context(), sale, user)
	if err != nil {
		web.Error(c, h.log, err)
		return
	}
	web.JSON(c, http.StatusOK, snap.place(*sale))
}

// read reads user's place in sale's room. If Redis lost the voucher's
// keys, it puts the stock back from MySQL first, as a join does: a lost
// stock key read as 0 would tell every waiter sold out.
func (h *Handler) read(ctx context.Context, sale *Sale, user int64) (snapshot, error) {
	snap, err := h.store.read(ctx, *sale, itoa(user))
	if errors.Is(err, ErrStockMissing) {
		if err = h.restock(ctx, sale.VoucherID); err == nil {
			snap, err = h.store.read(ctx, *sale, itoa(user))
		}
	}
	return snap, err
}

// heartbeat: a stream sends the place at least this often, changed or
// not (the contract's 15 seconds).
const heartbeat = 15 * time.Second

// streamFor bounds one stream: a client's EventSource opens a new one by
// itself.
const streamFor = 10 * time.Minute

// Events answers GET /vouchers/{id}/room/events: the caller's place as
// server-sent events (event: place), when its state changes, when the
// number of buyers ahead changes (at most once a second), and at least
// every 15 seconds.
//
// A thousand waiters must not cost Redis a thousand reads a second: the
// instance's one reader of the room (feeds) reads the room's figures twice
// a second, and each stream works out its own place from them and the
// number it read when it opened. A stream asks Redis for its own place
// only when its state may have changed in a way the figures cannot tell:
// while its buyer is admitted (they may buy), when the line reaches its
// number, when someone joins while its buyer is not in line (it may be
// them), and at each heartbeat.
func (h *Handler) Events(c *gin.Context) {
	sale, ok := h.sale(c)
	if !ok {
		return
	}
	ctx, user := c.Request.Context(), auth.From(c).UserID
	sub, leave, err := h.feeds.join(*sale, user)
	if err != nil {
		web.Error(c, h.log, err)
		return
	}
	defer leave()
	snap, err := h.read(ctx, sale, user)
	if err != nil {
		web.Error(c, h.log, err)
		return
	}
	stream, err := web.OpenStream(c)
	if err != nil {
		return
	}
	var sent Place
	var sentAt time.Time
	emit := func(p Place, force bool) error {
		aheadMoved := !sameInt(p.Ahead, sent.Ahead) && time.Since(sentAt) >= time.Second
		if !force && p.State == sent.State && !aheadMoved {
			return nil
		}
		data, _ := json.Marshal(p)
		sent, sentAt = p, time.Now()
		return stream.Send(append(append([]byte("event: place\ndata: "), data...), "\n\n"...))
	}
	if emit(snap.place(*sale), true) != nil {
		return
	}
	beat := time.NewTicker(heartbeat)
	defer beat.Stop()
	end := time.After(streamFor)
	for {
		force := false
		select {
		case <-sub.changed():
		case <-beat.C:
			force = true
		case <-ctx.Done():
			return
		case <-h.done:
			return
		case <-end:
			return
		}
		room := sub.figures()
		// The line reached this buyer, their hold is on, or a
		// heartbeat: their own place, read; otherwise worked out.
		// Or a join since (the line grew) while this buyer was not in
		// it: perhaps theirs, from another tab.
		reread := force || snap.state == StateAdmitted ||
			(snap.state == StateWaiting && snap.number > 0 && room.serving >= snap.number) ||
			(snap.state == StateWaiting && snap.number < 0 && !room.now.Before(sale.Begin)) ||
			((snap.state == StateNone || snap.state == StateExpired) && room.total != snap.total)
		if reread {
			if s, err := h.store.read(ctx, *sale, itoa(user)); err == nil {
				snap = s
			}
		} else {
			snap.serving, snap.free, snap.total, snap.now = room.serving, room.free, room.total, room.now
			if snap.state == StateAdmitted && !room.now.Before(time.UnixMilli(snap.until)) {
				snap.state = StateExpired
			}
		}
		if emit(snap.place(*sale), force) != nil {
			return
		}
	}
}

func sameInt(a, b *int64) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }
