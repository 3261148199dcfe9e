package order

import (
	"context"
	_ "embed"
	"fmt"
	"regexp"

	"github.com/redis/go-redis/v9"

	"seckill/internal/apperr"
	"seckill/internal/stock"
)

// Dead letters are not a grave. An accepted order lands there only when
// MySQL refuses the order itself (sold out by MySQL's count, the user
// already holds another order, a value it cannot store), never because
// MySQL was away. Sending it there settles what its acceptance took in
// Redis (dead.lua): the unit goes back, unless MySQL said none was left,
// and the buyer may buy again, unless they hold another order. So
// stock + orders = initial holds once the queue is empty, and nobody is
// locked out by an order that does not exist.
//
// An admin lists them (GET /admin/dead-letters) and replays one or all
// (POST /admin/dead-letters/replay): the order goes back into the queue
// with its ID, taking a unit again, and then lands or comes back here
// with its reason.

var (
	//go:embed replay.lua
	replaySrc    string
	replayScript = redis.NewScript(replaySrc)
)

// DeadLetter is an accepted order MySQL would not take.
type DeadLetter struct {
	ID        string `json:"id"` // the dead letter's own ID, for replay
	OrderID   string `json:"order_id"`
	UserID    string `json:"user_id"`
	VoucherID string `json:"voucher_id"`
	Error     string `json:"error"`
}

func deadLetterOf(m redis.XMessage) DeadLetter {
	str := func(k string) string { s, _ := m.Values[k].(string); return s }
	return DeadLetter{ID: m.ID, OrderID: str("id"), UserID: str("user"), VoucherID: str("voucher"), Error: str("error")}
}

// MaxDeadLetters is the most dead letters listed or replayed in one call.
const MaxDeadLetters = 1000

// DeadLetters lists up to limit dead letters, oldest first.
func (s *Service) DeadLetters(ctx context.Context, limit int) ([]DeadLetter, error) {
	msgs, err := s.rdb.XRangeN(ctx, DeadKey, "-", "+", int64(min(max(limit, 1), MaxDeadLetters))).Result()
	if err != nil {
		return nil, apperr.Down(fmt.Errorf("list dead letters: %w", err))
	}
	out := make([]DeadLetter, 0, len(msgs))
	for _, m := range msgs {
		out = append(out, deadLetterOf(m))
	}
	return out, nil
}

// Replayed is what a replay did with one dead letter.
type Replayed struct {
	ID      string `json:"id"`
	OrderID string `json:"order_id"`
	// Result is "requeued" (the order waits in the queue again: it lands,
	// or comes back with its reason), "sold_out", "already_ordered" (it
	// stays a dead letter: no unit left, or the user holds an order), or
	// "malformed" (no order can be made of it) or "not_found".
	Result string `json:"result"`
}

// ReplayInput names the dead letters to replay: IDs, or all.
type ReplayInput struct {
	IDs []string `json:"ids"`
	All bool     `json:"all"`
}

var streamID = regexp.MustCompile(`^[0-9]{1,20}-[0-9]{1,20}$`)

// Replay puts the dead letters named by in back in the queue (with all,
// the oldest MaxDeadLetters).
func (s *Service) Replay(ctx context.Context, in ReplayInput) ([]Replayed, error) {
	if in.All == (len(in.IDs) > 0) {
		return nil, apperr.Invalid(`give either "ids" (dead letter IDs) or "all": true`)
	}
	if len(in.IDs) > MaxDeadLetters {
		return nil, apperr.Invalid(fmt.Sprintf("at most %d ids at once", MaxDeadLetters))
	}
	for _, id := range in.IDs {
		if !streamID.MatchString(id) {
			return nil, apperr.Invalid(fmt.Sprintf("%q is not a dead letter ID (such as 1700000000000-0)", id))
		}
	}
	// A replayed order goes back on the stream, and in sync mode no
	// consumer reads it: the unit would stay taken and the order pending
	// for good. Dead letters are async mode's; sync mode can only show them.
	if _, async := s.mode.(asyncMode); !async {
		return nil, apperr.Invalid("replay needs SECKILL_MODE=async: in sync mode nothing writes the orders it would queue")
	}
	ids := in.IDs
	var msgs []redis.XMessage
	if len(ids) == 0 {
		var err error
		if msgs, err = s.rdb.XRangeN(ctx, DeadKey, "-", "+", MaxDeadLetters).Result(); err != nil {
			return nil, apperr.Down(fmt.Errorf("list dead letters: %w", err))
		}
	}
	out := []Replayed{}
	for _, id := range ids {
		found, err := s.rdb.XRangeN(ctx, DeadKey, id, id, 1).Result()
		if err != nil {
			return nil, apperr.Down(fmt.Errorf("read dead letter %s: %w", id, err))
		}
		if len(found) == 0 {
			out = append(out, Replayed{ID: id, Result: "not_found"})
			continue
		}
		msgs = append(msgs, found[0])
	}
	for _, m := range msgs {
		r, err := s.replay(ctx, m)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// replay.lua's answers, and what each tells the admin.
const replayNoStock = 3 // the voucher's stock key is missing: reload it

var replayResults = map[int]string{0: "requeued", 1: "sold_out", 2: "already_ordered", 4: "not_found"}

func (s *Service) replay(ctx context.Context, m redis.XMessage) (Replayed, error) {
	r := Replayed{ID: m.ID, OrderID: deadLetterOf(m).OrderID}
	o, err := ParseEntry(m)
	if err != nil {
		r.Result = "malformed"
		return r, nil
	}
	k := stock.KeysOf(o.VoucherID)
	keys := []string{DeadKey, StreamKey, PendingKey, k.Stock, k.Buyers, AcceptedKey(o.VoucherID), QueuedKey(o.VoucherID)}
	for attempt := 0; ; attempt++ {
		code, err := replayScript.Run(ctx, s.rdb, keys, m.ID, o.ID, o.UserID, o.VoucherID, o.CreatedAt.UnixMilli()).Int()
		if err != nil {
			return r, apperr.Down(fmt.Errorf("replay dead letter %s: %w", m.ID, err))
		}
		if code == replayNoStock {
			if err := s.restore(ctx, o.VoucherID, attempt); err != nil {
				return r, err
			}
			continue
		}
		r.Result = replayResults[code]
		return r, nil
	}
}
