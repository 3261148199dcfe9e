package order

import (
	"context"
	_ "embed"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

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
	ID        string `json:"id"` // the dead letter's own ID, for replay (see deadLetterID)
	OrderID   string `json:"order_id"`
	UserID    string `json:"user_id"`
	VoucherID string `json:"voucher_id"`
	Error     string `json:"error"`
}

// deadLetter is a dead letter as read: its shard and its entry there.
type deadLetter struct {
	shard int
	redis.XMessage
}

func (d deadLetter) public() DeadLetter {
	str := func(k string) string { s, _ := d.Values[k].(string); return s }
	return DeadLetter{ID: deadLetterID(d.shard, d.ID), OrderID: str("id"), UserID: str("user"), VoucherID: str("voucher"), Error: str("error")}
}

// deadLetterID names a dead letter: its shard's dead letters hold it
// under a stream entry ID, unique only within the shard, so the shard
// comes first: "3:1700000000000-0".
func deadLetterID(shard int, entry string) string { return strconv.Itoa(shard) + ":" + entry }

var deadLetterIDPattern = regexp.MustCompile(`^(0|[1-9][0-9]?):([0-9]{1,20}-[0-9]{1,20})$`)

// parseDeadLetterID undoes deadLetterID.
func parseDeadLetterID(id string) (shard int, entry string, ok bool) {
	m := deadLetterIDPattern.FindStringSubmatch(id)
	if m == nil {
		return 0, "", false
	}
	shard, _ = strconv.Atoi(m[1])
	return shard, m[2], shard < stock.Shards
}

// compareEntryIDs orders dead letter IDs by their entries' time (then
// sequence, then shard): oldest first.
func compareEntryIDs(a, b string) int {
	key := func(id string) []uint64 {
		shard, entry, _ := parseDeadLetterID(id)
		ms, seq, _ := strings.Cut(entry, "-")
		m, _ := strconv.ParseUint(ms, 10, 64)
		q, _ := strconv.ParseUint(seq, 10, 64)
		return []uint64{m, q, uint64(shard)}
	}
	return slices.Compare(key(a), key(b))
}

// MaxDeadLetters is the most dead letters listed or replayed in one call.
const MaxDeadLetters = 1000

// oldestDead reads up to limit dead letters of every shard, oldest first.
func (s *Service) oldestDead(ctx context.Context, limit int) ([]deadLetter, error) {
	var all []deadLetter
	for k := range stock.Shards {
		msgs, err := s.rdb.XRangeN(ctx, DeadKey(k), "-", "+", int64(limit)).Result()
		if err != nil {
			return nil, apperr.Down(fmt.Errorf("list dead letters: %w", err))
		}
		for _, m := range msgs {
			all = append(all, deadLetter{k, m})
		}
	}
	slices.SortFunc(all, func(a, b deadLetter) int {
		return compareEntryIDs(deadLetterID(a.shard, a.ID), deadLetterID(b.shard, b.ID))
	})
	return all[:min(len(all), limit)], nil
}

// DeadLetters lists up to limit dead letters, oldest first.
func (s *Service) DeadLetters(ctx context.Context, limit int) ([]DeadLetter, error) {
	dead, err := s.oldestDead(ctx, min(max(limit, 1), MaxDeadLetters))
	if err != nil {
		return nil, err
	}
	out := make([]DeadLetter, 0, len(dead))
	for _, d := range dead {
		out = append(out, d.public())
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
		if _, _, ok := parseDeadLetterID(id); !ok {
			return nil, apperr.Invalid(fmt.Sprintf("%q is not a dead letter ID (such as 3:1700000000000-0, as GET /admin/dead-letters lists them)", id))
		}
	}
	// A replayed order goes back on the stream, and in sync mode no
	// consumer reads it: the unit would stay taken and the order pending
	// for good. Dead letters are async mode's; sync mode can only show them.
	if _, async := s.mode.(asyncMode); !async {
		return nil, apperr.Invalid("replay needs SECKILL_MODE=async: in sync mode nothing writes the orders it would queue")
	}
	var dead []deadLetter
	if in.All {
		var err error
		if dead, err = s.oldestDead(ctx, MaxDeadLetters); err != nil {
			return nil, err
		}
	}
	out := []Replayed{}
	for _, id := range in.IDs {
		shard, entry, _ := parseDeadLetterID(id)
		found, err := s.rdb.XRangeN(ctx, DeadKey(shard), entry, entry, 1).Result()
		if err != nil {
			return nil, apperr.Down(fmt.Errorf("read dead letter %s: %w", id, err))
		}
		if len(found) == 0 {
			out = append(out, Replayed{ID: id, Result: "not_found"})
			continue
		}
		dead = append(dead, deadLetter{shard, found[0]})
	}
	for _, d := range dead {
		r, err := s.replay(ctx, d)
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

func (s *Service) replay(ctx context.Context, d deadLetter) (Replayed, error) {
	pub := d.public()
	r := Replayed{ID: pub.ID, OrderID: pub.OrderID}
	o, err := ParseEntry(d.XMessage)
	if err != nil || stock.ShardOf(o.VoucherID) != d.shard {
		r.Result = "malformed"
		return r, nil
	}
	k := stock.KeysOf(o.VoucherID)
	keys := []string{DeadKey(d.shard), StreamKey(d.shard), PendingKey(d.shard), k.Stock, k.Buyers, AcceptedKey(o.VoucherID), QueuedKey(o.VoucherID)}
	for attempt := 0; ; attempt++ {
		code, err := replayScript.Run(ctx, s.rdb, keys, d.ID, o.ID, o.UserID, o.VoucherID, o.CreatedAt.UnixMilli()).Int()
		if err != nil {
			return r, apperr.Down(fmt.Errorf("replay dead letter %s: %w", pub.ID, err))
		}
		if code == replayNoStock {
			if err := s.restore(ctx, o.VoucherID, 1, attempt); err != nil {
				return r, err
			}
			continue
		}
		r.Result = replayResults[code]
		return r, nil
	}
}
