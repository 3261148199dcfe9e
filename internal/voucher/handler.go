package voucher

import (
	"log/slog"
	"net/http"

	"github.com/gin-gonic/gin"

	"seckill/internal/auth"
	"seckill/internal/web"
)

// Handler serves /vouchers.
type Handler struct {
	svc *Service
	log *slog.Logger
}

// NewHandler returns a Handler.
func NewHandler(svc *Service, log *slog.Logger) *Handler { return &Handler{svc: svc, log: log} }

// Create answers POST /vouchers (admins): a new voucher on sale.
func (h *Handler) Create(c *gin.Context) {
	var in CreateInput
	if !web.BindJSON(c, &in) {
		return
	}
	v, err := h.svc.Create(c.Request.Context(), auth.From(c).UserID, c.GetHeader("Idempotency-Key"), in)
	if err != nil {
		web.Error(c, h.log, err)
		return
	}
	web.JSON(c, http.StatusCreated, v)
}

// Get answers GET /vouchers/{id}.
func (h *Handler) Get(c *gin.Context) {
	id, ok := web.ID(c, "id")
	if !ok {
		return
	}
	v, err := h.svc.Get(c.Request.Context(), id)
	if err != nil {
		web.Error(c, h.log, err)
		return
	}
	web.JSON(c, http.StatusOK, v)
}
