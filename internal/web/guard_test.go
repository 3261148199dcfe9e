package web

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"seckill/internal/apperr"
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
	r.Use(ReadBody(time.Second, MaxBody))
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

// Around the cap, the server reads a small body before it and a larger
// one (or one of no declared length) after it: what runs between the two
// (the cap) sees a small body read already, a large one not yet; the
// handler gets either whole.
func TestReadBodySmallFirst(t *testing.T) {
	gin.SetMode(gin.TestMode)
	r := gin.New()
	var between bool
	r.Use(ReadBody(time.Second, SmallBody), func(c *gin.Context) { _, between = c.Get(bodyRead) }, ReadBody(time.Second, MaxBody))
	r.POST("/echo", func(c *gin.Context) {
		b, _ := io.ReadAll(c.Request.Body)
		c.String(http.StatusOK, "%d", len(b))
	})
	for _, tt := range []struct {
		name      string
		size      int
		chunked   bool
		readFirst bool
	}{
		{"small", 100, false, true},
		{"at SmallBody", SmallBody, false, true},
		{"larger", SmallBody + 1, false, false},
		{"no declared length", 100, true, false},
	} {
		body := strings.Repeat("x", tt.size)
		req := httptest.NewRequest("POST", "/echo", strings.NewReader(body))
		if tt.chunked {
			req.ContentLength = -1
		}
		w := httptest.NewRecorder()
		between = false
		r.ServeHTTP(w, req)
		if w.Code != http.StatusOK || w.Body.String() != fmt.Sprint(tt.size) {
			t.Errorf("%s: %d %q, want 200 and the whole body", tt.name, w.Code, w.Body)
		}
		if between != tt.readFirst {
			t.Errorf("%s: read before the cap = %v, want %v", tt.name, between, tt.readFirst)
		}
	}
}

// A client that hangs up is no store down: whatever wrapped its
// cancellation (apperr.Down included), Error logs no warning.
func TestErrorClientGone(t *testing.T) {
	gin.SetMode(gin.TestMode)
	var buf strings.Builder
	log := slog.New(slog.NewTextHandler(&buf, nil))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w := httptest.NewRecorder()
	c, _ := gin.CreateTestContext(w)
	c.Request = httptest.NewRequest("GET", "/x", nil).WithContext(ctx)
	Error(c, log, apperr.Down(fmt.Errorf("read stock: %w", context.Canceled)))
	if buf.Len() != 0 {
		t.Errorf("a client gone was logged: %s", buf.String())
	}
	if w.Code != http.StatusServiceUnavailable {
		t.Errorf("answered %d, want 503", w.Code)
	}
	// A store that is down, while the client waits, is a warning.
	c, _ = gin.CreateTestContext(httptest.NewRecorder())
	c.Request = httptest.NewRequest("GET", "/x", nil)
	Error(c, log, apperr.Down(errors.New("dial tcp: connection refused")))
	if !strings.Contains(buf.String(), "level=WARN") {
		t.Errorf("a store down was not a warning: %q", buf.String())
	}
}
