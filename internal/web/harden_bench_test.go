package web

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gin-gonic/gin"
)

// BenchmarkHarden is the security headers' cost to every answer: a gin
// engine with Harden alone, into a writer that keeps nothing.
func BenchmarkHarden(b *testing.B) {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Use(Harden())
	r.POST("/x", func(c *gin.Context) { c.Status(http.StatusConflict) })
	req := httptest.NewRequest(http.MethodPost, "/x", nil)
	req.Header.Set("Authorization", "Bearer x")
	w := &headerSink{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		clear(w.h)
		r.ServeHTTP(w, req)
	}
}

// headerSink is a ResponseWriter that keeps the headers only.
type headerSink struct{ h http.Header }

func (s *headerSink) Header() http.Header         { return s.h }
func (s *headerSink) WriteHeader(int)             {}
func (s *headerSink) Write(p []byte) (int, error) { return len(p), nil }
