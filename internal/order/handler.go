package order

import (
	"log/slog"
	"net/http"
	"strconv"

	"github.com/gin-gonic/gin"

	"seckill/internal/auth"
	"seckill/internal/web"
)

// Handler serves the buy button and the orders. cmd/server's routes.go
// puts it behind authentication (which sets auth.From) and, for the buy
// button, the user's rate.
type Handler struct {
	svc *Service
	log *slog.Logger
}

// NewHandler returns a Handler.
func NewHandler(svc *Service, log *slog.Logger) *Handler { return &Handler{svc: svc, log: log} }

// Seckill answers POST /seckill/{voucherId}: the buy button.
func (h *Handler) Seckill(c *gin.Context) {
	voucherID, ok := web.ID(c, "voucherId")
	if !ok {
		return
	}
	id, err := h.svc.Seckill(c.Request.Context(), auth.From(c).UserID, voucherID)
	if err != nil {
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

// Get answers GET /orders/{id}.
func (h *Handler) Get(c *gin.Context) {
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
