package queue

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"seckill/internal/apperr"
	"seckill/internal/stock"
	"seckill/internal/testenv"
	"seckill/internal/web"
)

// FuzzReplayInput posts any body to the replay handler (POST
// /admin/dead-letters/replay, past its admin guard) in front of a Redis
// that is down: a body Replay takes goes on to read the dead letters and
// is answered 503 unavailable, which is how the target tells "taken" from
// "refused" without a server. Run it with
//
//	go test -run '^$' -fuzz '^FuzzReplayInput$' -fuzztime 30s ./internal/order/queue
//
// It asserts: never a panic, never another 5xx; a body is taken exactly
// when it is one JSON object of ReplayInput's shape that gives either
// "all": true or 1 to MaxDeadLetters "ids", each a dead letter ID (a
// shard below stock.Shards in one or two digits, a colon, and a stream
// entry ID: digits-digits, at most 20 digits each, nothing around them); every
// other body gets 400 (413 past the body limit) invalid_argument in the
// contract's envelope.
func FuzzReplayInput(f *testing.F) {
	for _, seed := range []string{
		`{"ids":["3:1700000000000-0"]}`,
		`{"ids":["3:1700000000000-0","15:1700000000000-1"]}`,
		`{"ids":["0:18446744073709551615-18446744073709551615"]}`,
		`{"ids":["1:123456789012345678901-0"]}`,
		`{"ids":["1700000000000-0"]}`,
		`{"ids":["16:1700000000000-0"]}`,
		`{"ids":["03:1-0"]}`,
		`{"ids":["123:1-0"]}`,
		`{"ids":[":1-0"]}`,
		`{"all":true}`,
		`{"all":false}`,
		`{"all":true,"ids":["3:1700000000000-0"]}`,
		`{"ids":[]}`,
		`{"ids":null,"all":null}`,
		`{"ids":["3:1700000000000"]}`,
		`{"ids":["3:-0"]}`,
		`{"ids":["3:1700000000000-0\n"]}`,
		`{"ids":[" 3:1-1"]}`,
		`{"ids":["3:１-1"]}`,
		`{"ids":["+"]}`,
		`{"ids":["0:0-0"]}`,
		`{"ids":"3:1700000000000-0"}`,
		`{"ids":[1700000000000]}`,
		`{"all":"true"}`,
		`{"all":1}`,
		`{}`,
		`null`,
		`{"all":true}{"all":true}`,
		``,
	} {
		f.Add([]byte(seed))
	}
	gin.SetMode(gin.TestMode)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	// Replay needs nothing but Redis before it has checked its input.
	restock := func(context.Context, int64) error { return nil } // replay is async mode's
	down := testenv.DownRedis(f)
	h := NewHandler(New(down, stock.NewStore(down, time.Minute)), restock, log)
	r := gin.New()
	r.Use(web.Recover(log), web.ReadBody(web.BodyTimeout, web.MaxBody))
	r.POST("/admin/dead-letters/replay", h.Replay)

	f.Fuzz(func(t *testing.T, body []byte) {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/admin/dead-letters/replay", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		r.ServeHTTP(rec, req)

		var in ReplayInput
		valid := json.Unmarshal(body, &in) == nil && validReplay(in)
		var env struct {
			Error struct {
				Code    apperr.Code `json:"code"`
				Message string      `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &env); err != nil || env.Error.Message == "" {
			t.Fatalf("answered %d %s to %q: not the envelope (%v)", rec.Code, rec.Body, body, err)
		}
		switch {
		case valid && rec.Code == http.StatusServiceUnavailable && env.Error.Code == apperr.Unavailable:
		case !valid && rec.Code == http.StatusBadRequest && env.Error.Code == apperr.InvalidArgument:
		case !valid && rec.Code == http.StatusRequestEntityTooLarge && len(body) > web.MaxBody:
		default:
			t.Fatalf("answered %d %s to %q (valid: %t)", rec.Code, rec.Body, body, valid)
		}
	})
}

// validReplay is Replay's contract written out the long way.
func validReplay(in ReplayInput) bool {
	if in.All {
		return len(in.IDs) == 0
	}
	if len(in.IDs) == 0 || len(in.IDs) > MaxDeadLetters {
		return false
	}
	for _, id := range in.IDs {
		shard, entry, ok := strings.Cut(id, ":")
		if !ok || len(shard) < 1 || len(shard) > 2 || !digits(shard) || !isStreamID(entry) {
			return false
		}
		if len(shard) == 2 && shard[0] == '0' {
			return false // "03": the shard is written as the list shows it, "3"
		}
		if n, _ := strconv.Atoi(shard); n >= stock.Shards {
			return false
		}
	}
	return true
}

func digits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// isStreamID reports whether s is two runs of 1 to 20 ASCII digits joined
// by a dash, as Redis writes stream entry IDs.
func isStreamID(s string) bool {
	run := func(s string) bool {
		if len(s) < 1 || len(s) > 20 {
			return false
		}
		for i := 0; i < len(s); i++ {
			if s[i] < '0' || s[i] > '9' {
				return false
			}
		}
		return true
	}
	for i := 0; i < len(s); i++ {
		if s[i] == '-' {
			return run(s[:i]) && run(s[i+1:])
		}
	}
	return false
}
