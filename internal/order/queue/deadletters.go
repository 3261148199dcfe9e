package queue

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

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
// with its ID, taking a unit again (accept.lua), and then lands or comes
// back here with its reason.

var (
	//go:embed dead.lua
	deadSrc    string
	deadScript = redis.NewScript(deadSrc)
)

// DeadLetter is an accepted order MySQL would not take, as admins see it.
type DeadLetter struct {
	ID        string `json:"id"` // the dead letter's own ID, for replay: "3:1700000000000-0"
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
	return DeadLetter{ID: d.id(), OrderID: field(d.XMessage, fieldOrder), UserID: field(d.XMessage, fieldUser),
		VoucherID: field(d.XMessage, fieldVoucher), Error: field(d.XMessage, fieldError)}
}

// A dead letter holds its entry's fields and these.
const (
	fieldError  = "error"     // why MySQL refused it
	fieldStream = "stream_id" // its entry's ID in the stream
)

// id names a dead letter: its shard's dead letters hold it under a stream
// entry ID, unique only within the shard, so the shard comes first:
// "3:1700000000000-0".
func (d deadLetter) id() string { return strconv.Itoa(d.shard) + ":" + d.ID }

var deadLetterIDPattern = regexp.MustCompile(`^(0|[1-9][0-9]?):([0-9]{1,20}-[0-9]{1,20})$`)

// parseDeadLetterID undoes id.
func parseDeadLetterID(id string) (shard int, entry string, ok bool) {
	m := deadLetterIDPattern.FindStringSubmatch(id)
	if m == nil {
		return 0, "", false
	}
	shard, _ = strconv.Atoi(m[1])
	return shard, m[2], shard < stock.Shards
}

// compare orders dead letters by their entries' time (then sequence, then
// shard): oldest first.
func (d deadLetter) compare(e deadLetter) int {
	key := func(x deadLetter) []uint64 {
		ms, seq, _ := strings.Cut(x.ID, "-")
		m, _ := strconv.ParseUint(ms, 10, 64)
		q, _ := strconv.ParseUint(seq, 10, 64)
		return []uint64{m, q, uint64(x.shard)}
	}
	return slices.Compare(key(d), key(e))
}

// MaxDeadLetters is the most dead letters listed or replayed in one call.
const MaxDeadLetters = 1000

// oldestDead reads up to limit dead letters of every shard, oldest first.
func (q *Queue) oldestDead(ctx context.Context, limit int) ([]deadLetter, error) {
	var all []deadLetter
	for k := range stock.Shards {
		msgs, err := q.rdb.XRangeN(ctx, deadKey(k), "-", "+", int64(limit)).Result()
		if err != nil {
			return nil, apperr.Down(fmt.Errorf("list dead letters: %w", err))
		}
		for _, m := range msgs {
			all = append(all, deadLetter{k, m})
		}
	}
	slices.SortFunc(all, deadLetter.compare)
	return all[:min(len(all), limit)], nil
}

// DeadLetters lists up to limit dead letters, oldest first.
func (q *Queue) DeadLetters(ctx context.Context, limit int) ([]DeadLetter, error) {
	dead, err := q.oldestDead(ctx, min(max(limit, 1), MaxDeadLetters))
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

// Restocker puts back a voucher's stock keys from MySQL after Redis lost
// them (package order's reload), so that a replayed order can take its
// unit again.
type Restocker func(ctx context.Context, voucherID int64) error

// Replay puts the dead letters named by in back in the queue (with all,
// the oldest MaxDeadLetters).
func (q *Queue) Replay(ctx context.Context, in ReplayInput, restock Restocker) ([]Replayed, error) {
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
	if restock == nil {
		return nil, apperr.Invalid("replay needs SECKILL_MODE=async: in sync mode nothing writes the orders it would queue")
	}
	var dead []deadLetter
	if in.All {
		var err error
		if dead, err = q.oldestDead(ctx, MaxDeadLetters); err != nil {
			return nil, err
		}
	}
	out := []Replayed{}
	for _, id := range in.IDs {
		shard, entry, _ := parseDeadLetterID(id)
		found, err := q.rdb.XRangeN(ctx, deadKey(shard), entry, entry, 1).Result()
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
		r, err := q.replay(ctx, d, restock)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// replayed names what a replay's run of accept.lua decided, for the
// admin.
func replayed(res Result) string {
	switch res {
	case Queued:
		return "requeued"
	case SoldOut:
		return "sold_out"
	case AlreadyBought, AlreadyBuying:
		return "already_ordered" // or buying it right now, by another request
	case noDeadLetter:
		return "not_found" // replayed already
	}
	return fmt.Sprintf("unknown answer %d", res)
}

// maxRestocks is how often a replay reloads a voucher's stock keys it
// finds missing: more than that, and Redis is losing them faster than
// they are put back.
const maxRestocks = 2

func (q *Queue) replay(ctx context.Context, d deadLetter, restock Restocker) (Replayed, error) {
	r := Replayed{ID: d.id(), OrderID: field(d.XMessage, fieldOrder)}
	e, err := parseEntry(d.XMessage)
	if err != nil || e.shard() != d.shard {
		r.Result = "malformed"
		return r, nil
	}
	dead := func(Entry) string { return deadKey(d.shard) }
	for attempt := 0; ; attempt++ {
		// Back into the bucket the dead letter's unit came from (its
		// settlement gave it back there), claiming the buyer at home
		// first if that is another bucket.
		var res Result
		if e.Bucket == e.home() {
			res, err = q.run(ctx, e, dead(e), d.ID, 0)
		} else if err = q.stocks.Undrop(ctx, e.VoucherID, e.Buckets, e.UserID, e.OrderID); err == nil {
			res, err = q.elsewhere(ctx, &e, d.ID, dead)
		}
		if err != nil {
			return r, apperr.Down(fmt.Errorf("replay dead letter %s: %w", r.ID, err))
		}
		if res == Lapsed {
			return r, apperr.Down(fmt.Errorf("replay dead letter %s: stalled past its buyer's claim; nothing was taken, try again", r.ID))
		}
		if res != StockMissing {
			r.Result = replayed(res)
			return r, nil
		}
		if attempt == maxRestocks {
			return r, apperr.Down(fmt.Errorf("keys of voucher %d still missing after restoring them", e.VoucherID))
		}
		if err := restock(ctx, e.VoucherID); err != nil {
			return r, err
		}
	}
}

// deadLetter moves an entry that cannot be written to the dead letters,
// with its error, acknowledges it so the rest flows on, marks its order
// failed, and settles its unit and buyer (see dead.lua): the unit goes
// back unless dropUnit (MySQL has no unit for it: Redis counted one too
// many), and the buyer is forgotten unless keepBuyer (they hold another
// order).
func (p *Consumer) deadLetter(ctx context.Context, m redis.XMessage, cause error, dropUnit, keepBuyer bool) {
	fields := []any{fieldStream, m.ID, fieldError, cause.Error()}
	for k, v := range m.Values {
		fields = append(fields, k, v)
	}
	unit, buyer := "back", "forget"
	if dropUnit {
		unit = "drop"
	}
	if keepBuyer {
		buyer = "keep"
	}
	keys := []string{p.stream, p.dead, p.pending}
	user := field(m, fieldUser)
	e, err := p.parse(m)
	if err == nil {
		k := stock.BucketKeys(e.VoucherID, e.Buckets, e.Bucket)
		keys = append(keys, k.Stock, k.Buyers, e.acceptedKey(), e.queuedKey())
	} else {
		user = "" // malformed: no voucher's keys to settle
	}
	args := append([]any{GroupName, m.ID, field(m, fieldOrder), user, unit, buyer}, fields...)
	if user != "" && !keepBuyer && e.Bucket != e.home() {
		// The unit came from another bucket than the buyer's home: the
		// script below settles the unit, and the buyer, remembered at
		// home (in another slot), is forgotten here, first, so that the
		// buyer is not left remembered by a script that ran but whose
		// answer was lost (the entry, acknowledged by it, would never
		// come back). Forgetting them is the point of no return: they
		// may buy again at once, so the entry must never be written
		// after all (MySQL, asked again, might take it, and the new
		// order would be refused as a second one). Should the script
		// fail, the entry stays pending, and whoever reads it again
		// finds the note kept with the forgetting and finishes this dead
		// letter as decided here (finishDeadLetters); the forgetting is
		// once per entry.
		note := unit + " " + cause.Error()
		if err := stock.DropBuyer(ctx, p.rdb, e.VoucherID, e.Buckets, e.UserID, e.OrderID, m.ID, note); err != nil {
			p.log.Warn("forget the buyer of a dead letter in their home bucket; the entry stays pending and is tried again", "id", m.ID, "err", err)
			return
		}
	}
	n, err := deadScript.Run(ctx, p.rdb, keys, args...).Int()
	if err != nil {
		p.log.Warn("dead-letter entry; it stays pending and is tried again", "id", m.ID, "err", err)
		return
	}
	if n == 1 {
		p.log.Error("entry sent to the dead letters", "id", m.ID, "values", m.Values, "err", cause)
	}
}

// finishDeadLetters takes out of a batch read again (not new: an entry
// delivered before) the entries whose dead letter was begun, their buyer
// forgotten at home, and finishes each as it was decided then (see
// deadLetter), without asking MySQL again; it returns the rest. A dead
// letter begun by a level-7 instance (a rolling upgrade) left no note,
// only its user's mark naming the order: it is finished with its unit
// dropped (errBegunBefore). Only an order whose unit came from another
// bucket than its buyer's home is dead-lettered in two steps, so only
// those are looked up. If the marks cannot be read, none of the batch is
// written now: it stays pending and is read again.
func (p *Consumer) finishDeadLetters(ctx context.Context, msgs []redis.XMessage, entries []Entry) ([]redis.XMessage, []Entry, error) {
	var away []stock.DropOf
	var at []int
	for i, e := range entries {
		if e.Bucket != e.home() {
			away = append(away, stock.DropOf{Voucher: e.VoucherID, Buckets: e.Buckets, User: e.UserID, Order: e.OrderID, Entry: msgs[i].ID})
			at = append(at, i)
		}
	}
	if len(away) == 0 {
		return msgs, entries, nil
	}
	notes, err := stock.DropNotes(ctx, p.rdb, away)
	if err != nil {
		return nil, nil, err
	}
	begun := map[int]bool{}
	for j, note := range notes {
		if !note.Begun {
			continue
		}
		i := at[j]
		begun[i] = true
		if note.Note == "" {
			p.log.Warn("finishing a dead letter begun by a level-7 instance, which kept no reason; the entry is not written and its unit is dropped", "id", msgs[i].ID)
			p.deadLetter(ctx, msgs[i], errBegunBefore, true, false)
			continue
		}
		unit, cause, _ := strings.Cut(note.Note, " ")
		p.log.Info("finishing a dead letter begun before; the entry is not written", "id", msgs[i].ID)
		p.deadLetter(ctx, msgs[i], errors.New(cause), unit == "drop", false)
	}
	if len(begun) == 0 {
		return msgs, entries, nil
	}
	var restMsgs []redis.XMessage
	var rest []Entry
	for i := range entries {
		if !begun[i] {
			restMsgs, rest = append(restMsgs, msgs[i]), append(rest, entries[i])
		}
	}
	return restMsgs, rest, nil
}

// errBegunBefore is the reason a dead letter gives when a level-7
// instance (up to 94b3afe, during a rolling upgrade) began it: its
// DropBuyer forgot the buyer and kept no note of why (stock.DropNotes).
//
// Its unit is dropped, not given back. Level 7 forgot the buyer when
// MySQL had no unit for the order (the unit to drop), or refused the
// order itself (IDTaken, or a refusal repeated MaxDeliveries times: the
// unit to give back). Dropping a unit MySQL has leaves Redis one short:
// a buyer may be told sold out a moment early, until the sweeper's
// reconciliation, once nothing of the voucher is held or queued, sets
// Redis' count to MySQL's. Giving back a unit MySQL lacks would let Redis
// accept an order MySQL must refuse: a buyer told their order is queued,
// and then dead-lettered. Only the first can never sell what is not
// there.
var errBegunBefore = errors.New("dead letter begun by a level-7 instance, which kept no reason: the unit is dropped (the sweeper's reconciliation gives it back if MySQL has it)")

// deadLetterAge is how long a dead letter is kept: long enough for an
// admin to see and replay it; it was settled when it was made, so dropping
// it later loses nothing but the record.
const deadLetterAge = 30 * 24 * time.Hour

// trimDead drops dead letters older than deadLetterAge, and the "failed"
// markers of their orders.
func (p *Consumer) trimDead(ctx context.Context) {
	cutoff := strconv.FormatInt(time.Now().Add(-deadLetterAge).UnixMilli(), 10)
	old, err := p.rdb.XRangeN(ctx, p.dead, "-", "("+cutoff, 1000).Result()
	if err != nil || len(old) == 0 {
		return
	}
	pipe := p.rdb.Pipeline()
	for _, m := range old {
		if id := field(m, fieldOrder); id != "" {
			pipe.HDel(ctx, p.pending, id)
		}
		pipe.XDel(ctx, p.dead, m.ID)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		p.log.Warn("trim old dead letters", "err", err)
	}
}
