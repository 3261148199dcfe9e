package voucher

import (
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"

	"github.com/gin-gonic/gin"

	"seckill/internal/apperr"
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

// List answers GET /vouchers: a page of vouchers, newest first, as
// ?limit= (1 to MaxPage, DefaultPage when absent) and ?before= (a voucher
// ID, the next_before of the previous page) ask. A malformed or repeated
// parameter is refused rather than read as its default: a client that
// asked for 500 and silently got 20 would think it had them all.
func (h *Handler) List(c *gin.Context) {
	limit, before := int64(DefaultPage), int64(0)
	q := c.Request.URL.Query()
	for _, p := range []struct {
		name string
		to   *int64
		max  int64
	}{{"limit", &limit, MaxPage}, {"before", &before, math.MaxInt64}} {
		vals, ok := q[p.name]
		if !ok {
			continue
		}
		// ParseInt takes a sign ("+5"); the contract's IDs are digits only.
		n, err := strconv.ParseInt(vals[0], 10, 64)
		if len(vals) != 1 || err != nil || n < 1 || n > p.max || vals[0][0] < '0' || vals[0][0] > '9' {
			web.Error(c, h.log, apperr.Invalid(fmt.Sprintf("%s must be given once, a decimal integer from 1 to %d", p.name, p.max)))
			return
		}
		*p.to = n
	}
	page, err := h.svc.List(c.Request.Context(), int(limit), before)
	if err != nil {
		web.Error(c, h.log, err)
		return
	}
	web.JSON(c, http.StatusOK, page)
}
