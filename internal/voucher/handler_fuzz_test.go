package voucher

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/gin-gonic/gin"

	"seckill/internal/apperr"
	"seckill/internal/stock"
	"seckill/internal/web"
)

// FuzzCreateInput posts any body to a route that does what the create
// handler does before its first I/O: bind a CreateInput and validate it
// (the rest needs MySQL and Redis). Run it with
//
//	go test -run '^$' -fuzz '^FuzzCreateInput$' -fuzztime 30s ./internal/voucher
//
// It asserts: never a panic, never a 5xx; every refusal is 400 (413 past
// the body limit) invalid_argument in the contract's envelope; and a
// voucher that passes is what the body said and fits its row: a title of
// 1 to 255 characters without surrounding spaces, a stock the INT column
// holds, whole-second UTC times, begin before end, between 1970 and 9999,
// buckets from 1 to stock.MaxBuckets.
func FuzzCreateInput(f *testing.F) {
	for _, seed := range []string{
		`{"title":"100 off","stock":100,"begin_time":"2026-11-20T12:00:00Z","end_time":"2026-11-21T12:00:00Z"}`,
		`{"title":"  padded  ","stock":0,"begin_time":"2026-11-20T20:00:00+08:00","end_time":"2026-11-20T12:00:01Z"}`,
		`{"title":"fractions","stock":1,"begin_time":"2026-11-20T12:00:00.9Z","end_time":"2026-11-20T12:00:01.1Z"}`,
		`{"title":"same second","stock":1,"begin_time":"2026-11-20T12:00:00.1Z","end_time":"2026-11-20T12:00:00.9Z"}`,
		`{"title":"max","stock":2147483647,"begin_time":"1970-01-01T00:00:00Z","end_time":"9999-12-31T23:59:59Z"}`,
		`{"title":"over","stock":2147483648,"begin_time":"2026-11-20T12:00:00Z","end_time":"2026-11-21T12:00:00Z"}`,
		`{"title":"negative","stock":-1,"begin_time":"2026-11-20T12:00:00Z","end_time":"2026-11-21T12:00:00Z"}`,
		`{"title":"early","stock":1,"begin_time":"1969-12-31T23:59:59Z","end_time":"2026-11-21T12:00:00Z"}`,
		`{"title":"late","stock":1,"begin_time":"2026-11-20T12:00:00Z","end_time":"9999-12-31T23:59:59-01:00"}`,
		`{"title":"reversed","stock":1,"begin_time":"2026-11-21T12:00:00Z","end_time":"2026-11-20T12:00:00Z"}`,
		`{"title":"not RFC 3339","stock":1,"begin_time":"2026-11-20 12:00:00","end_time":"2026-11-21T12:00:00Z"}`,
		`{"title":"   ","stock":1,"begin_time":"2026-11-20T12:00:00Z","end_time":"2026-11-21T12:00:00Z"}`,
		`{"title":"` + strings.Repeat("é", 256) + `","stock":1,"begin_time":"2026-11-20T12:00:00Z","end_time":"2026-11-21T12:00:00Z"}`,
		`{"title":"\u0000\ud800","stock":1.0,"begin_time":"2026-11-20T12:00:00Z","end_time":"2026-11-21T12:00:00Z"}`,
		`{"title":"missing stock","begin_time":"2026-11-20T12:00:00Z","end_time":"2026-11-21T12:00:00Z"}`,
		`{"title":"hot","stock":9,"buckets":16,"begin_time":"2026-11-20T12:00:00Z","end_time":"2026-11-21T12:00:00Z"}`,
		`{"title":"too many","stock":9,"buckets":17,"begin_time":"2026-11-20T12:00:00Z","end_time":"2026-11-21T12:00:00Z"}`,
		`{"title":"none","stock":9,"buckets":0,"begin_time":"2026-11-20T12:00:00Z","end_time":"2026-11-21T12:00:00Z"}`,
		`{"title":null,"stock":null,"begin_time":null,"end_time":null}`,
		`{}`,
		`[]`,
		``,
	} {
		f.Add([]byte(seed))
	}
	gin.SetMode(gin.TestMode)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	var made *Voucher
	r := gin.New()
	r.Use(web.Recover(log), web.ReadBody(web.BodyTimeout, web.MaxBody))
	r.POST("/vouchers", func(c *gin.Context) {
		made = nil
		var in CreateInput
		if !web.BindJSON(c, &in) {
			return
		}
		v, err := in.validate(time.Now())
		if err != nil {
			web.Error(c, log, err)
			return
		}
		made = v
		c.Status(http.StatusCreated)
	})

	f.Fuzz(func(t *testing.T, body []byte) {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/vouchers", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		r.ServeHTTP(rec, req)

		switch rec.Code {
		case http.StatusCreated:
			var in CreateInput
			if err := json.Unmarshal(body, &in); err != nil {
				t.Fatalf("took %q, which encoding/json refuses: %v", body, err)
			}
			checkVoucher(t, in, made)
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
			var env struct {
				Error struct {
					Code    apperr.Code `json:"code"`
					Message string      `json:"message"`
				} `json:"error"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &env); err != nil || env.Error.Code != apperr.InvalidArgument || env.Error.Message == "" {
				t.Fatalf("%d %s is not the invalid_argument envelope (%v)", rec.Code, rec.Body, err)
			}
			if rec.Code == http.StatusRequestEntityTooLarge && len(body) <= web.MaxBody {
				t.Fatalf("413 for a body of %d bytes", len(body))
			}
		default:
			t.Fatalf("answered %d %s to %q", rec.Code, rec.Body, body)
		}
	})
}

// checkVoucher checks that v, made of in, is what in says and fits the
// vouchers table.
func checkVoucher(t *testing.T, in CreateInput, v *Voucher) {
	t.Helper()
	if in.Title == nil || in.Stock == nil || in.BeginTime == nil || in.EndTime == nil {
		t.Fatalf("took %+v, which lacks a field", in)
	}
	switch n := utf8.RuneCountInString(v.Title); {
	case v.Title != strings.TrimSpace(*in.Title):
		t.Fatalf("title %q from %q: want it trimmed and otherwise as given", v.Title, *in.Title)
	case n < 1 || n > 255 || !utf8.ValidString(v.Title):
		t.Fatalf("title %q does not fit VARCHAR(255)", v.Title)
	}
	if v.Stock != *in.Stock || v.InitialStock != *in.Stock || v.Stock < 0 || v.Stock > MaxStock {
		t.Fatalf("stock %d, initial %d from %d: want both equal to it, within 0 to %d", v.Stock, v.InitialStock, *in.Stock, MaxStock)
	}
	if want := 1; in.Buckets != nil && *in.Buckets != v.Buckets || in.Buckets == nil && v.Buckets != want || v.Buckets < 1 || v.Buckets > stock.MaxBuckets {
		t.Fatalf("buckets %d from %v: want it as given (1 when absent), within 1 to %d", v.Buckets, in.Buckets, stock.MaxBuckets)
	}
	for _, tt := range []struct {
		name     string
		got, put time.Time
	}{{"begin_time", v.BeginTime, *in.BeginTime}, {"end_time", v.EndTime, *in.EndTime}} {
		if tt.got.Location() != time.UTC || tt.got.Nanosecond() != 0 || !tt.got.Equal(tt.put.Truncate(time.Second)) {
			t.Fatalf("%s %s from %s: want it in UTC, to the second below", tt.name, tt.got, tt.put)
		}
	}
	if !v.BeginTime.Before(v.EndTime) || v.BeginTime.Year() < 1970 || v.EndTime.Year() > 9999 {
		t.Fatalf("window [%s, %s): want begin before end, between 1970 and 9999", v.BeginTime, v.EndTime)
	}
	if v.ID != 0 || !v.CreatedAt.IsZero() {
		t.Fatalf("ID %d and CreatedAt %s set before the row is written", v.ID, v.CreatedAt)
	}
}
