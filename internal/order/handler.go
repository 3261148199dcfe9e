package order

import (
	"log/slog"
	"net/http"
	"strconv"

	"github.com/gin-gonic/gin"

	"seckill/internal/apperr"
	"seckill/internal/auth"
	"seckill/internal/web"
)

// Handler serves /seckill and /orders.
type Handler struct {
	svc *Service
	log *slog.Logger
}

// NewHandler returns a Handler.
func NewHandler(svc *Service, log *slog.Logger) *Handler { return &Handler{svc: svc, log: log} }

// SeckillRoute is the buy button's route, in gin's pattern.
const SeckillRoute = "/seckill/:voucherId"

// Register adds the routes, behind authn (which must set auth.From);
// admin guards the ones only admins may call, and throttle the buy button
// (a user's requests over their rate are refused before any work).
func (h *Handler) Register(r gin.IRouter, authn, admin, throttle gin.HandlerFunc) {
	r.POST(SeckillRoute, authn, throttle, h.seckill)
	r.GET("/orders/:id", authn, h.get)
	r.GET("/admin/queue", authn, admin, h.queue)
	r.GET("/admin/dead-letters", authn, admin, h.deadLetters)
	r.POST("/admin/dead-letters/replay", authn, admin, h.replay)
}

func (h *Handler) deadLetters(c *gin.Context) {
	list, err := h.svc.DeadLetters(c.Request.Context(), MaxDeadLetters)
	if err != nil {
		web.Error(c, h.log, err)
		return
	}
	web.JSON(c, http.StatusOK, gin.H{"dead_letters": list})
}

func (h *Handler) replay(c *gin.Context) {
	var in ReplayInput
	if !web.BindJSON(c, &in) {
		return
	}
	res, err := h.svc.Replay(c.Request.Context(), in)
	if err != nil {
		web.Error(c, h.log, err)
		return
	}
	web.JSON(c, http.StatusOK, gin.H{"replayed": res})
}

func (h *Handler) queue(c *gin.Context) {
	st, err := h.svc.QueueStats(c.Request.Context())
	if err != nil {
		web.Error(c, h.log, apperr.Down(err))
		return
	}
	web.JSON(c, http.StatusOK, st)
}

// ErrorKey is where the seckill handler leaves, in the gin context, the
// error it answered: a middleware that counts answers by outcome (package
// metrics) reads it there, since the status alone cannot tell sold_out
// from already_ordered (both 409).
const ErrorKey = "order.seckill.error"

// Answer names the answer the buy button gave in c, once it is written:
// "ok" for a 200, else the error code of the contract (sold_out and
// already_ordered, both 409, told apart by the error left at ErrorKey).
// The metrics and the live view count answers by it.
func Answer(c *gin.Context) string {
	switch c.Writer.Status() {
	case http.StatusOK:
		return "ok"
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		return string(apperr.InvalidArgument)
	case http.StatusUnauthorized:
		return string(apperr.Unauthorized)
	case http.StatusForbidden:
		return string(apperr.Forbidden)
	case http.StatusNotFound:
		return string(apperr.NotFound)
	case http.StatusTooManyRequests:
		return string(apperr.Busy)
	case http.StatusServiceUnavailable:
		return string(apperr.Unavailable)
	case http.StatusConflict:
		v, _ := c.Get(ErrorKey)
		err, _ := v.(error)
		if e := apperr.As(err); e != nil && apperr.Status(e.Code) == http.StatusConflict {
			return string(e.Code)
		}
	}
	return string(apperr.Internal)
}

func (h *Handler) seckill(c *gin.Context) {
	voucherID, ok := web.ID(c, "voucherId")
	if !ok {
		return
	}
	id, err := h.svc.Seckill(c.Request.Context(), auth.From(c).UserID, voucherID)
	if err != nil {
		c.Set(ErrorKey, err)
		web.Error(c, h.log, err)
		return
	}
	// {"order_id": "<id>"}, written directly: the answer of every sale,
	// and encoding/json over a map costs more than the rest of it.
	b := make([]byte, 0, 40)
	b = append(b, `{"order_id":"`...)
	b = strconv.AppendInt(b, id, 10)
	b = append(b, `"}`...)
	c.Data(http.StatusOK, "application/json; charset=utf-8", b)
}

func (h *Handler) get(c *gin.Context) {
	id, ok := web.ID(c, "id")
	if !ok {
		return
	}
	who := auth.From(c)
	o, err := h.svc.Get(c.Request.Context(), id, who.UserID, who.Role == auth.RoleAdmin)
	if err != nil {
		web.Error(c, h.log, err)
		return
	}
	web.JSON(c, http.StatusOK, o)
}
