package queue

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/stock"
	"seckill/internal/testenv"
)

// A Redis that is full refuses a script at its first write, so accept.lua
// refused wrote nothing: Accept says so (ErrRefused), and the buyer is
// answered 503 at once instead of asking Lost, whose void mark Redis would
// refuse too, until the request's time ran out. On a private
// redis-server: a maxmemory of 1 byte would refuse every other test's
// writes on the shared one.
//
// It fails if Accept answers a plain error (the caller would ask Lost), if
// the refused script or claim left anything behind, or if the claim made
// before an away bucket refused its script stays open (locking the user
// out until it expires).
func TestAcceptRefusedWhenRedisIsFull(t *testing.T) {
	rdb := testenv.StartRedis(t).Client(t)
	q := New(rdb, stock.NewStore(rdb, time.Minute))
	ctx := context.Background()
	full := func(on bool) {
		t.Helper()
		v := "0"
		if on {
			v = "1"
		}
		if err := rdb.ConfigSet(ctx, "maxmemory", v).Err(); err != nil {
			t.Fatal(err)
		}
	}
	refused := func(what string, res Result, err error) {
		t.Helper()
		if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "OOM") {
			t.Errorf("%s, Redis full: Accept = %d, %v; want ErrRefused, with Redis' OOM", what, res, err)
		}
	}
	s := split{t, rdb}

	// A voucher in one bucket: the script is refused.
	if err := q.stocks.Init(ctx, 9, 5, 1); err != nil {
		t.Fatal(err)
	}
	before := dump(t, rdb)
	full(true)
	e := Entry{OrderID: 100, UserID: 1, VoucherID: 9, At: time.Now(), Buckets: 1}
	res, err := q.Accept(ctx, &e)
	full(false)
	refused("one bucket", res, err)
	if after := dump(t, rdb); !maps.Equal(before, after) {
		t.Errorf("a refused Accept changed Redis")
	}

	// A split voucher whose home bucket is empty: the claim at home is
	// refused, before any script.
	splitStock(t, q, rdb, 0, 1, 0)
	u := homedAt(0, 1)[0]
	before = dump(t, rdb)
	full(true)
	e = order(200, u)
	res, err = q.Accept(ctx, &e)
	full(false)
	refused("the claim", res, err)
	if after := dump(t, rdb); !maps.Equal(before, after) {
		t.Errorf("a refused claim changed Redis")
	}

	// The claim made, then the away bucket's script refused (Redis
	// fills between them): the claim is dropped.
	admin := redis.NewClient(&redis.Options{Addr: rdb.Options().Addr})
	t.Cleanup(func() { admin.Close() })
	hook := &fillBeforeAccept{t: t, admin: admin, stock: stock.BucketKeys(splitVoucher, splitParts, 1).Stock}
	rdb.AddHook(hook)
	e = order(201, u)
	res, err = q.Accept(ctx, &e)
	refused("the away bucket", res, err)
	if !hook.filled {
		t.Fatal("the hook never saw accept.lua: the case was not made")
	}
	if s.buyer(0, u) || s.claims() != 0 || s.stock(1) != 1 {
		t.Errorf("after the refusal: buyer %v, claims %d, bucket 1's stock %d; want no buyer, no claim, 1 unit",
			s.buyer(0, u), s.claims(), s.stock(1))
	}
	// And with room again, the same buyer buys.
	e = order(202, u)
	if res, err := q.Accept(ctx, &e); err != nil || res != Queued {
		t.Errorf("Accept with room again = %d, %v; want queued", res, err)
	}
}

// fillBeforeAccept sets Redis' maxmemory to 1 byte around the first run
// of accept.lua on the stock key given, through a client of its own
// (admin), and notes that it did.
type fillBeforeAccept struct {
	t      *testing.T
	admin  *redis.Client
	stock  string
	filled bool
}

func (h *fillBeforeAccept) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *fillBeforeAccept) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *fillBeforeAccept) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		name := strings.ToLower(cmd.Name())
		if (name != "evalsha" && name != "eval") || len(args) < 4 ||
			(args[1] != acceptScript.Hash() && args[1] != acceptSrc) || args[3] != h.stock || h.filled {
			return next(ctx, cmd)
		}
		h.filled = true
		if err := h.admin.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
			h.t.Error(err)
		}
		defer func() {
			if err := h.admin.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
				h.t.Error(err)
			}
		}()
		return next(ctx, cmd)
	}
}

// replyError is an error reply as go-redis hands it over (it implements
// redis.Error): only a private-server test can make Redis send each of
// them, and only OOM is made above.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

// Which errors mean "Redis refused the write, nothing ran": Redis 7's
// replies that keep their code, wrapped or not; not Redis 6's wrapping of
// a script's error, not a network error, not a reply of another kind.
func TestRefusal(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{replyError("OOM command not allowed when used memory > 'maxmemory'. script: abc, on @user_script:100."), true},
		{replyError("MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk."), true},
		{replyError("READONLY You can't write against a read only replica. script: abc, on @user_script:12."), true},
		{replyError("NOREPLICAS Not enough good replicas to write."), true},
		{fmt.Errorf("claim buyer: %w", replyError("OOM command not allowed when used memory > 'maxmemory'.")), true},
		{replyError("ERR Error running script (call to f_abc): @user_script:100: -OOM command not allowed"), false},
		{replyError("NOSCRIPT No matching script."), false},
		{replyError("BUSY Redis is busy running a script."), false},
		{errors.New("OOM lookalike that is no reply"), false},
		{io.ErrUnexpectedEOF, false},
	} {
		if got := errors.Is(refusal(c.err), ErrRefused); got != c.want {
			t.Errorf("refusal(%q) is ErrRefused: %v, want %v", c.err, got, c.want)
		}
	}
}
