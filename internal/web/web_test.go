package web

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
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

// envelope is the contract's error envelope, as a client decodes it.
type envelope struct {
	Error struct {
		Code    apperr.Code `json:"code"`
		Message string      `json:"message"`
	} `json:"error"`
}

// The hand-written envelope decodes to what encoding/json would have
// written, whatever the message holds: quotes, backslashes, control
// characters, HTML, any UTF-8 and invalid UTF-8.
func FuzzErrorEnvelope(f *testing.F) {
	for _, s := range []string{"sold out", `say "hi"\`, "line\nbreak\x00\x1f", "<b>&</b>", "秒杀 ✓", "bad \xff\xfe utf-8", "\u2028"} {
		f.Add(s)
	}
	gin.SetMode(gin.TestMode)
	f.Fuzz(func(t *testing.T, msg string) {
		rec := httptest.NewRecorder()
		c, _ := gin.CreateTestContext(rec)
		abort(c, http.StatusConflict, apperr.SoldOut, msg)
		var got envelope
		if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
			t.Fatalf("answer %q is not JSON: %v", rec.Body, err)
		}
		want, _ := json.Marshal(msg)
		var wantMsg string
		json.Unmarshal(want, &wantMsg)
		if got.Error.Code != apperr.SoldOut || got.Error.Message != wantMsg {
			t.Fatalf("answer %q decodes to %+v, want code %s message %q", rec.Body, got.Error, apperr.SoldOut, wantMsg)
		}
		if ct := rec.Header().Get("Content-Type"); ct != "application/json; charset=utf-8" {
			t.Fatalf("content type %q", ct)
		}
		if !c.IsAborted() || rec.Code != http.StatusConflict {
			t.Fatalf("aborted %v, status %d", c.IsAborted(), rec.Code)
		}
	})
}

// A JSON body is read only under Content-Type application/json (any case,
// with parameters, but no charset other than UTF-8): anything else is
// 415 in the envelope, so that no page of another site can post JSON
// here as a browser's "simple" cross-site request (text/plain, a form).
// Body, for the routes whose body is optional, takes an empty body with
// no Content-Type at all.
func TestJSONContentType(t *testing.T) {
	gin.SetMode(gin.TestMode)
	r := gin.New()
	r.POST("/bind", func(c *gin.Context) {
		var in struct{ Phone string }
		if BindJSON(c, &in) {
			c.String(http.StatusOK, in.Phone)
		}
	})
	r.POST("/body", func(c *gin.Context) {
		if b, ok := Body(c); ok {
			c.String(http.StatusOK, string(b))
		}
	})
	const body = `{"phone":"13800000000"}`
	tests := []struct {
		name  string
		types []string // the Content-Type headers sent
		body  string
		bind  int // the status of /bind
		raw   int // the status of /body
	}{
		{"application/json", []string{"application/json"}, body, 200, 200},
		{"with charset", []string{"application/json; charset=utf-8"}, body, 200, 200},
		{"in capitals", []string{"Application/JSON; Charset=UTF-8"}, body, 200, 200},
		{"without spaces", []string{"application/json;charset=utf-8"}, body, 200, 200},
		{"another parameter", []string{"application/json; v=1"}, body, 200, 200},
		{"none", nil, body, 415, 415},
		{"empty", []string{""}, body, 415, 415},
		{"text/plain", []string{"text/plain"}, body, 415, 415},
		{"text/plain with charset", []string{"text/plain; charset=utf-8"}, body, 415, 415},
		{"a form", []string{"application/x-www-form-urlencoded"}, body, 415, 415},
		{"multipart", []string{"multipart/form-data; boundary=x"}, body, 415, 415},
		{"another JSON type", []string{"application/merge-patch+json"}, body, 415, 415},
		{"prefix only", []string{"application/jsonx"}, body, 415, 415},
		{"two types in one", []string{"application/json, text/plain"}, body, 415, 415},
		{"a malformed parameter", []string{"application/json; charset"}, body, 415, 415},
		{"Latin-1", []string{"application/json; charset=iso-8859-1"}, body, 415, 415},
		{"UTF-16", []string{"application/json; charset=utf-16"}, body, 415, 415},
		{"twice", []string{"application/json", "text/plain"}, body, 415, 415},
		{"twice the same", []string{"application/json", "application/json"}, body, 415, 415},
		// No body: BindJSON wants one, as JSON; Body takes none as none.
		{"no body, no type", nil, "", 415, 200},
		{"no body as JSON", []string{"application/json"}, "", 400, 200},
		{"no body as text", []string{"text/plain"}, "", 415, 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, path := range []string{"/bind", "/body"} {
				req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(tt.body))
				for _, ct := range tt.types {
					req.Header.Add("Content-Type", ct)
				}
				rec := httptest.NewRecorder()
				r.ServeHTTP(rec, req)
				want := tt.bind
				if path == "/body" {
					want = tt.raw
				}
				if rec.Code != want {
					t.Errorf("%s: %d %s, want %d", path, rec.Code, rec.Body, want)
				}
				var e envelope
				if want == http.StatusUnsupportedMediaType && (json.Unmarshal(rec.Body.Bytes(), &e) != nil || e.Error.Code != apperr.UnsupportedMediaType || e.Error.Message == "") {
					t.Errorf("%s: 415 with %s, not the envelope with code %s", path, rec.Body, apperr.UnsupportedMediaType)
				}
			}
		})
	}
	if s := apperr.Status(apperr.UnsupportedMediaType); s != http.StatusUnsupportedMediaType {
		t.Errorf("unsupported_media_type is %d, want 415", s)
	}
}

// TestReuseKeys: what one request set is gone for the next, though its
// map is reused, and the values work as gin's own map's would.
func TestReuseKeys(t *testing.T) {
	r := gin.New()
	r.Use(ReuseKeys())
	r.GET("/:set", func(c *gin.Context) {
		if v, ok := c.Get("left"); ok {
			t.Errorf("a value of an earlier request is still there: %v", v)
		}
		c.Set("left", c.Param("set"))
		if v := c.GetString("left"); v != c.Param("set") {
			t.Errorf("got %q back, want %q", v, c.Param("set"))
		}
		c.Status(http.StatusNoContent)
	})
	for _, p := range []string{"/a", "/b", "/c"} {
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, p, nil))
		if rec.Code != http.StatusNoContent {
			t.Fatalf("%s: status %d", p, rec.Code)
		}
	}
}

// TestErrorOverHTTP: an envelope sent by a real server carries its
// Content-Length and Content-Type (abort leaves the length to net/http,
// where gin's c.Data set it itself).
// A long envelope (past net/http's 2 KiB buffer, which counts a short
// one's length itself) gets its Content-Length too, not chunks.
func TestErrorOverHTTP(t *testing.T) {
	r := gin.New()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	long := strings.Repeat("x", 3000)
	r.POST("/x", func(c *gin.Context) { Error(c, log, apperr.New(apperr.SoldOut, "sold out")) })
	r.POST("/long", func(c *gin.Context) { Error(c, log, apperr.Invalid(long)) })
	srv := httptest.NewServer(r)
	defer srv.Close()
	for path, want := range map[string]string{
		"/x":    `{"error":{"code":"sold_out","message":"sold out"}}`,
		"/long": `{"error":{"code":"invalid_argument","message":"` + long + `"}}`,
	} {
		resp, err := http.Post(srv.URL+path, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if string(body) != want {
			t.Errorf("%s: got %d %.80s, want %.80s", path, resp.StatusCode, body, want)
		}
		if resp.ContentLength != int64(len(want)) || resp.Header.Get("Content-Length") == "" {
			t.Errorf("%s: Content-Length %q (%d), want %d", path, resp.Header.Get("Content-Length"), resp.ContentLength, len(want))
		}
		if ct := resp.Header.Get("Content-Type"); ct != "application/json; charset=utf-8" {
			t.Errorf("%s: Content-Type %q", path, ct)
		}
	}
}

// TestReuseKeysConcurrently: requests in flight at once, over a real
// server, each keep their own values (under -race, a map shared between
// two of them is also a reported race).
func TestReuseKeysConcurrently(t *testing.T) {
	r := gin.New()
	r.Use(ReuseKeys())
	r.GET("/:who", func(c *gin.Context) {
		c.Set("who", c.Param("who"))
		time.Sleep(time.Millisecond) // the others set theirs meanwhile
		if got := c.GetString("who"); got != c.Param("who") {
			t.Errorf("request of %s sees %q", c.Param("who"), got)
		}
		c.Status(http.StatusNoContent)
	})
	srv := httptest.NewServer(r)
	defer srv.Close()
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			for j := range 20 {
				resp, err := http.Get(fmt.Sprintf("%s/u%d-%d", srv.URL, i, j))
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
}
