package order

import (
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"

	"seckill/internal/apperr"
	"seckill/internal/auth"
	"seckill/internal/payment"
	"seckill/internal/web"
)

// Handler serves the buy button, the orders and their lifecycle, and the
// payment provider's webhook. cmd/server's routes.go puts all but the
// webhook behind authentication (which sets auth.From) and the buy button
// behind the user's rate too.
type Handler struct {
	svc           *Service
	webhookSecret []byte // the payment provider's HMAC key (package payment)
	now           func() time.Time
	log           *slog.Logger
}

// NewHandler returns a Handler; webhookSecret is the key the payment
// provider signs its webhook calls with.
func NewHandler(svc *Service, webhookSecret []byte, now func() time.Time, log *slog.Logger) *Handler {
	return &Handler{svc: svc, webhookSecret: webhookSecret, now: now, log: log}
}

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

// Cancel answers POST /orders/{id}/cancel: the buyer cancels their unpaid
// order.
func (h *Handler) Cancel(c *gin.Context) {
	h.change(c, func(id int64, who auth.Identity) (View, error) {
		return h.svc.Cancel(c.Request.Context(), id, who.UserID)
	})
}

// Refund answers POST /orders/{id}/refund: the buyer, or an admin,
// refunds a paid order.
func (h *Handler) Refund(c *gin.Context) {
	h.change(c, func(id int64, who auth.Identity) (View, error) {
		return h.svc.Refund(c.Request.Context(), id, who.UserID, who.Role == auth.RoleAdmin)
	})
}

// Pay answers POST /orders/{id}/pay: the buyer asks the payment provider
// to charge them; the order is paid once the provider confirms, through
// the webhook. 202: asked, not yet paid.
func (h *Handler) Pay(c *gin.Context) {
	id, ok := web.ID(c, "id")
	if !ok {
		return
	}
	o, err := h.svc.Pay(c.Request.Context(), id, auth.From(c).UserID)
	if err != nil {
		web.Error(c, h.log, err)
		return
	}
	web.JSON(c, http.StatusAccepted, o)
}

func (h *Handler) change(c *gin.Context, do func(id int64, who auth.Identity) (View, error)) {
	id, ok := web.ID(c, "id")
	if !ok {
		return
	}
	o, err := do(id, auth.From(c))
	if err != nil {
		web.Error(c, h.log, err)
		return
	}
	web.JSON(c, http.StatusOK, o)
}

// Webhook answers POST /payments/webhook: the payment provider's word
// that a buyer paid. No token: the signature (Seckill-Signature) is the
// provider's proof, checked against the raw body before anything is read
// from it.
func (h *Handler) Webhook(c *gin.Context) {
	body, ok := web.Body(c)
	if !ok {
		return
	}
	if err := payment.Verify(h.webhookSecret, body, c.GetHeader(payment.Header), h.now()); err != nil {
		web.Error(c, h.log, apperr.New(apperr.Unauthorized, "the event's signature is missing, wrong or stale"))
		return
	}
	e, err := payment.ParseEvent(body)
	if err != nil {
		web.Error(c, h.log, apperr.Invalid(err.Error()))
		return
	}
	a, err := h.svc.ApplyPayment(c.Request.Context(), e)
	if err != nil {
		web.Error(c, h.log, err)
		return
	}
	web.JSON(c, http.StatusOK, a)
}
