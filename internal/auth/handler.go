package auth

import (
	"log/slog"
	"net/http"
	"strconv"

	"github.com/gin-gonic/gin"

	"seckill/internal/web"
)

// Handler serves /auth.
type Handler struct {
	svc      *Service
	devCodes bool
	log      *slog.Logger
}

// NewHandler returns a Handler; devCodes puts the code in the response.
func NewHandler(svc *Service, devCodes bool, log *slog.Logger) *Handler {
	return &Handler{svc: svc, devCodes: devCodes, log: log}
}

// SendCode answers POST /auth/code: a login code for a phone.
func (h *Handler) SendCode(c *gin.Context) {
	var in struct {
		Phone string `json:"phone"`
	}
	if !web.BindJSON(c, &in) {
		return
	}
	// ClientIP is the connection's peer unless that peer is a proxy the
	// engine was told to trust (cmd/server: TRUSTED_PROXIES); only then
	// does X-Forwarded-For count. Trusting it from anyone would let each
	// request name a fresh address and walk past the per-address limit.
	code, err := h.svc.SendCode(c.Request.Context(), in.Phone, c.ClientIP())
	if err != nil {
		web.Error(c, h.log, err)
		return
	}
	out := gin.H{"sent": true}
	if h.devCodes {
		out["code"] = code
	}
	web.JSON(c, http.StatusOK, out)
}

// Login answers POST /auth/login: a token for a phone and its code.
func (h *Handler) Login(c *gin.Context) {
	var in struct {
		Phone string `json:"phone"`
		Code  string `json:"code"`
	}
	if !web.BindJSON(c, &in) {
		return
	}
	// The address as for SendCode: the guess limits count per address.
	token, u, err := h.svc.Login(c.Request.Context(), in.Phone, in.Code, c.ClientIP())
	if err != nil {
		web.Error(c, h.log, err)
		return
	}
	web.JSON(c, http.StatusOK, gin.H{
		"token": token,
		"user":  gin.H{"id": strconv.FormatInt(u.ID, 10), "phone": u.Phone},
	})
}

// Logout answers POST /auth/logout: "log out everywhere". Every token of
// the caller's issued until now, this one included, stops working on
// every instance within Refresh; a login afterwards gets a token that
// works.
func (h *Handler) Logout(c *gin.Context) {
	if err := h.svc.Logout(c.Request.Context(), From(c).UserID); err != nil {
		web.Error(c, h.log, err)
		return
	}
	web.JSON(c, http.StatusOK, gin.H{"logged_out": true})
}
