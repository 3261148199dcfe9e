package web

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
)

// Every answer carries the security headers, an error and an unknown
// route's too; two Authorization headers are refused, whichever route.
func TestHarden(t *testing.T) {
	gin.SetMode(gin.TestMode)
	r := gin.New()
	r.Use(Harden())
	r.NoRoute(NotFound)
	r.GET("/ok", func(c *gin.Context) { c.Status(http.StatusOK) })
	want := map[string]string{
		"X-Content-Type-Options":  "nosniff",
		"X-Frame-Options":         "DENY",
		"Content-Security-Policy": "frame-ancestors 'none'",
		"Referrer-Policy":         "no-referrer",
	}
	for _, path := range []string{"/ok", "/nowhere"} {
		w := httptest.NewRecorder()
		r.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
		for k, v := range want {
			if got := w.Header().Get(k); got != v {
				t.Errorf("GET %s: %s = %q, want %q", path, k, got, v)
			}
		}
	}

	req := httptest.NewRequest("GET", "/ok", nil)
	req.Header.Add("Authorization", "Bearer a")
	req.Header.Add("Authorization", "Bearer b")
	w := httptest.NewRecorder()
	r.ServeHTTP(w, req)
	if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), `"invalid_argument"`) {
		t.Errorf("two Authorization headers: %d %s, want 400 invalid_argument", w.Code, w.Body)
	}
	req = httptest.NewRequest("GET", "/ok", nil)
	req.Header.Set("Authorization", "Bearer a")
	w = httptest.NewRecorder()
	r.ServeHTTP(w, req)
	if w.Code != http.StatusOK {
		t.Errorf("one Authorization header: %d, want 200", w.Code)
	}
}

// A body that trickles in is cut off at ReadBody's deadline, well before
// the server's own read timeout, and the handler (and whatever middleware
// comes after ReadBody, such as the cap on requests in flight) never runs
// for it; a whole body reaches the handler intact.
func TestReadBodyDeadline(t *testing.T) {
	gin.SetMode(gin.TestMode)
	r := gin.New()
	reached := make(chan string, 4)
	r.Use(ReadBody(time.Second))
	r.POST("/echo", func(c *gin.Context) {
		b, _ := io.ReadAll(c.Request.Body)
		reached <- string(b)
		c.String(http.StatusOK, "%s", b)
	})
	srv := httptest.NewUnstartedServer(r)
	srv.Config.ReadTimeout = time.Minute
	srv.Start()
	defer srv.Close()

	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	fmt.Fprintf(conn, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to a trickled body: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	took := time.Since(start)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "did not arrive whole") {
		t.Errorf("trickled body: %d %s, want 400", resp.StatusCode, body)
	}
	if took > 20*time.Second {
		t.Errorf("the trickled body was cut off after %s: by the server's read timeout, not ReadBody's deadline", took)
	}
	select {
	case b := <-reached:
		t.Errorf("the handler ran for a body that never arrived (%q)", b)
	default:
	}

	res, err := http.Post(srv.URL+"/echo", "application/json", strings.NewReader(`{"phone":"13800000000"}`))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || string(got) != `{"phone":"13800000000"}` {
		t.Errorf("whole body: %d %q", res.StatusCode, got)
	}
}
