package web

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"seckill/internal/apperr"
)

// The fuzz targets below are the server's front door: every request body
// goes through BindJSON and every numeric path segment through ID. Run one
// with, for example,
//
//	go test -run '^$' -fuzz '^FuzzBindJSON$' -fuzztime 30s ./internal/web
//
// Without -fuzz, go test runs their seeds and testdata/fuzz as tests.

// shapes has a field of every kind the handlers' bodies bind: strings,
// pointers that tell a missing field from a zero one, numbers, RFC 3339
// times, lists and booleans.
type shapes struct {
	S string     `json:"s"`
	P *string    `json:"p"`
	N *int64     `json:"n"`
	T *time.Time `json:"t"`
	L []string   `json:"l"`
	B bool       `json:"b"`
}

// FuzzBindJSON sends any body through the middleware every route has
// (Recover, ReadBody) to a handler that binds it. BindJSON must never
// panic nor answer 5xx; it takes a body exactly when encoding/json takes
// it as one value of the shape (nothing before or after it), and refuses
// every other one with 400 invalid_argument in the contract's envelope.
func FuzzBindJSON(f *testing.F) {
	for _, seed := range []string{
		`{"s":"a","p":"b","n":42,"t":"2026-11-20T12:00:00Z","l":["x","y"],"b":true}`,
		`{}`,
		`null`,
		` {"s":"spaces around"} `,
		`{"n":9223372036854775807}`,
		`{"n":9223372036854775808}`,
		`{"n":1.5}`,
		`{"n":"42"}`,
		`{"t":"2026-13-40T25:61:61Z"}`,
		`{"t":"10000-01-01T00:00:00Z"}`,
		`{"l":"not a list"}`,
		`{"s":"\ud800"}`,
		`{"s":"a"}{"s":"b"}`,
		`{"s":"a"} trailing`,
		`[1,2,3]`,
		`"just a string"`,
		`{"s":`,
		``,
		"\xff\xfe{}",
	} {
		f.Add([]byte(seed))
	}
	gin.SetMode(gin.TestMode)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	var bound shapes
	r := gin.New()
	r.Use(Recover(log), ReadBody(BodyTimeout, MaxBody))
	r.POST("/", func(c *gin.Context) {
		bound = shapes{}
		if !BindJSON(c, &bound) {
			return
		}
		c.Status(http.StatusNoContent)
	})

	f.Fuzz(func(t *testing.T, body []byte) {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		r.ServeHTTP(rec, req)

		var want shapes
		takes := json.Unmarshal(body, &want) == nil
		switch {
		case rec.Code == http.StatusNoContent && takes:
			if !reflect.DeepEqual(bound, want) {
				t.Fatalf("bound %+v, encoding/json reads %+v", bound, want)
			}
		case rec.Code == http.StatusNoContent:
			t.Fatalf("took a body encoding/json refuses: %q", body)
		case rec.Code == http.StatusBadRequest && !takes:
			checkInvalid(t, rec)
		case rec.Code == http.StatusRequestEntityTooLarge && len(body) > MaxBody:
			checkInvalid(t, rec)
		default:
			t.Fatalf("answered %d %s to %q (encoding/json takes it: %t)", rec.Code, rec.Body, body, takes)
		}
	})
}

// FuzzID calls ID with any path segment. It must never panic, take
// exactly the segments written in decimal digits alone whose value is a
// positive int64, return that value, and refuse every other segment with
// 400 invalid_argument.
func FuzzID(f *testing.F) {
	for _, seed := range []string{
		"1", "42", "007", "9223372036854775807", "9223372036854775808",
		"99999999999999999999999", "0", "-1", "+1", " 1", "1 ", "1e3",
		"0x10", "1_000", "١٢٣", "", "1/2", "%31",
	} {
		f.Add(seed)
	}
	gin.SetMode(gin.TestMode)

	f.Fuzz(func(t *testing.T, segment string) {
		rec := httptest.NewRecorder()
		c, _ := gin.CreateTestContext(rec)
		c.Request = httptest.NewRequest(http.MethodGet, "/", nil)
		c.Params = gin.Params{{Key: "id", Value: segment}}
		id, ok := ID(c, "id")

		want, valid := decimalID(segment)
		switch {
		case ok && valid:
			if id != want {
				t.Fatalf("ID(%q) = %d, want %d", segment, id, want)
			}
			if rec.Body.Len() != 0 || c.IsAborted() {
				t.Fatalf("ID(%q) took it but answered %d %s", segment, rec.Code, rec.Body)
			}
		case ok:
			t.Fatalf("ID(%q) = %d, want it refused", segment, id)
		case valid:
			t.Fatalf("ID(%q) refused a valid ID", segment)
		default:
			if id != 0 || !c.IsAborted() || rec.Code != http.StatusBadRequest {
				t.Fatalf("ID(%q) refused with %d, %d (aborted: %t), want 0 and 400", segment, id, rec.Code, c.IsAborted())
			}
			checkInvalid(t, rec)
		}
	})
}

// decimalID is ID's contract written out the long way: one or more ASCII
// digits, nothing else, whose value is between 1 and the largest int64.
func decimalID(s string) (int64, bool) {
	if s == "" {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(s, 10, 64) // digits only: fails only past int64
	return n, err == nil && n > 0
}

// checkInvalid checks that rec is the contract's error envelope with code
// invalid_argument and a message.
func checkInvalid(t *testing.T, rec *httptest.ResponseRecorder) {
	t.Helper()
	var env struct {
		Error struct {
			Code    apperr.Code `json:"code"`
			Message string      `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &env); err != nil || env.Error.Code != apperr.InvalidArgument || env.Error.Message == "" {
		t.Fatalf("answer %d %s is not the invalid_argument envelope (%v)", rec.Code, rec.Body, err)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json; charset=utf-8" {
		t.Fatalf("answer %d has Content-Type %q", rec.Code, ct)
	}
}
