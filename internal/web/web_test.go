package web

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"seckill/internal/apperr"
)

func TestRetrySeconds(t *testing.T) {
	tests := []struct {
		after time.Duration
		want  int
	}{
		{-time.Second, 1},
		{0, 1},
		{time.Millisecond, 1},
		{time.Second, 1},
		{time.Second + time.Millisecond, 2},
		{59900 * time.Millisecond, 60},
		{15 * time.Minute, 900},
	}
	for _, tt := range tests {
		if got := retrySeconds(tt.after); got != tt.want {
			t.Errorf("retrySeconds(%s) = %d, want %d", tt.after, got, tt.want)
		}
	}
}

// Error adds Retry-After only to errors that carry a hint, and answers
// them in the same envelope as any other.
func TestErrorRetryAfter(t *testing.T) {
	gin.SetMode(gin.TestMode)
	busy := apperr.New(apperr.Busy, "slow down")
	tests := []struct {
		name       string
		err        error
		status     int
		retryAfter string
	}{
		{"busy with a hint", apperr.RetryAfter(busy, 1500*time.Millisecond), http.StatusTooManyRequests, "2"},
		{"wrapped busy with a hint", errors.Join(errors.New("context"), apperr.RetryAfter(busy, 14*time.Minute)), http.StatusTooManyRequests, "840"},
		{"busy without a hint", busy, http.StatusTooManyRequests, ""},
		{"not found", apperr.New(apperr.NotFound, "no"), http.StatusNotFound, ""},
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			c, _ := gin.CreateTestContext(rec)
			c.Request = httptest.NewRequest(http.MethodPost, "/", nil)
			Error(c, log, tt.err)
			if rec.Code != tt.status || rec.Header().Get("Retry-After") != tt.retryAfter {
				t.Errorf("status %d, Retry-After %q; want %d, %q", rec.Code, rec.Header().Get("Retry-After"), tt.status, tt.retryAfter)
			}
			var body struct {
				Error struct{ Code, Message string }
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body.Error.Code == "" || body.Error.Message == "" {
				t.Errorf("body %s is not the envelope (%v)", rec.Body, err)
			}
			if !errors.Is(tt.err, busy) && tt.status == http.StatusTooManyRequests {
				t.Errorf("the hint hides the sentinel from errors.Is")
			}
		})
	}
}
