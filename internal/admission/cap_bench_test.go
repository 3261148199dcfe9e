package admission

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gin-gonic/gin"
)

// BenchmarkCapLimit is the cost the cap on requests in flight adds to
// every request on the hot path (a sold-out answer's budget is tens of
// microseconds): the middleware's take and give of a slot around a
// handler that does nothing, from one IPv4 and one IPv6 client, many
// requests at once.
func BenchmarkCapLimit(b *testing.B) {
	gin.SetMode(gin.ReleaseMode)
	for _, client := range []struct{ name, addr string }{
		{"ipv4", "192.0.2.7:40000"},
		{"ipv6", "[2001:db8:1:2::7]:40000"},
	} {
		b.Run(client.name, func(b *testing.B) {
			r := gin.New()
			r.Use(NewCap(1024).Limit(func(c *gin.Context, err error) { c.AbortWithStatus(http.StatusTooManyRequests) }))
			r.GET("/x", func(c *gin.Context) { c.Status(http.StatusConflict) })
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				w := httptest.NewRecorder()
				req := httptest.NewRequest(http.MethodGet, "/x", nil)
				req.RemoteAddr = client.addr
				for pb.Next() {
					r.ServeHTTP(w, req)
				}
			})
		})
	}
}

// BenchmarkCapLimitOff is the same route without the cap: the
// yardstick the figures above are read against.
func BenchmarkCapLimitOff(b *testing.B) {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.GET("/x", func(c *gin.Context) { c.Status(http.StatusConflict) })
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		w := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/x", nil)
		req.RemoteAddr = "192.0.2.7:40000"
		for pb.Next() {
			r.ServeHTTP(w, req)
		}
	})
}
