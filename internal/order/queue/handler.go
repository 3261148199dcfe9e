package queue

import (
	"log/slog"
	"net/http"

	"github.com/gin-gonic/gin"

	"seckill/internal/apperr"
	"seckill/internal/web"
)

// Handler serves the admin's view of the queue: its state, the dead
// letters, and their replay. cmd/server's routes.go puts it behind the
// admin guard.
type Handler struct {
	q       *Queue
	restock Restocker
	log     *slog.Logger
}

// NewHandler returns a Handler. restock reloads a voucher's stock keys
// that Redis lost, for a replayed order; nil refuses replays, as sync mode
// must: no consumer reads the stream there, and a replayed order would
// wait in it for good.
func NewHandler(q *Queue, restock Restocker, log *slog.Logger) *Handler {
	return &Handler{q: q, restock: restock, log: log}
}

// Stats answers GET /admin/queue.
func (h *Handler) Stats(c *gin.Context) {
	st, err := h.q.Stats(c.Request.Context())
	if err != nil {
		web.Error(c, h.log, apperr.Down(err))
		return
	}
	web.JSON(c, http.StatusOK, st)
}

// DeadLetters answers GET /admin/dead-letters.
func (h *Handler) DeadLetters(c *gin.Context) {
	list, err := h.q.DeadLetters(c.Request.Context(), MaxDeadLetters)
	if err != nil {
		web.Error(c, h.log, err)
		return
	}
	web.JSON(c, http.StatusOK, gin.H{"dead_letters": list})
}

// Replay answers POST /admin/dead-letters/replay.
func (h *Handler) Replay(c *gin.Context) {
	var in ReplayInput
	if !web.BindJSON(c, &in) {
		return
	}
	res, err := h.q.Replay(c.Request.Context(), in, h.restock)
	if err != nil {
		web.Error(c, h.log, err)
		return
	}
	web.JSON(c, http.StatusOK, gin.H{"replayed": res})
}
