// Package stock keeps each voucher's sellable stock in Redis, where a
// flash sale's thousands of requests a second can be answered without
// touching MySQL.
//
// Per voucher it keeps three keys, all with the hash tag of the voucher's
// shard (shard.go) so that they live in one Redis Cluster slot and one Lua
// script may touch them all, with the other keys of that shard (async
// mode's stream of orders):
//
//	seckill:{s7.43}:v7:stock   units left
//	seckill:{s7.43}:v7:buyers  users who took a unit (one order per user)
//	seckill:{s7.43}:v7:holds   user -> deadline: units taken whose order
//	                           row is not written yet
//
// A request takes a unit with Take. Once its order row is committed it calls
// Confirm; if anything fails it calls GiveBack. A hold is what makes the
// unit recoverable when the process dies in between (SIGKILL, OOM, power):
// the Sweeper in package order finds expired holds with Expired and returns
// their units with Reclaim, unless the order row exists after all.
//
// MySQL stays the truth. Redis may lose keys (a flush, a restart without
// persistence): Take then reports Missing and the caller reloads the voucher
// from MySQL with Load.
package stock

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Result is what Take decided.
type Result int

// Take's results; the values are the script's return codes.
const (
	Taken         Result = 0
	SoldOut       Result = 1 // nothing left, and nothing can come back
	AlreadyBought Result = 2 // the user's order is settled
	Missing       Result = 3
	// SoldOutForNow: nothing left, but requests still hold units that
	// come back if they fail.
	SoldOutForNow Result = 4
	// AlreadyBuying: a request of the user holds a unit; if it fails,
	// the user may buy again.
	AlreadyBuying Result = 5
)

var (
	//go:embed take.lua
	takeSrc    string
	takeScript = redis.NewScript(takeSrc)

	//go:embed giveback.lua
	givebackSrc    string
	givebackScript = redis.NewScript(givebackSrc)

	//go:embed expired.lua
	expiredSrc    string
	expiredScript = redis.NewScript(expiredSrc)

	//go:embed reconcile.lua
	reconcileSrc    string
	reconcileScript = redis.NewScript(reconcileSrc)
)

// Keys names one voucher's keys.
type Keys struct {
	Stock, Buyers, Holds string
}

// KeysOf builds the keys of voucher id. This is the only place that
// spells them.
func KeysOf(id int64) Keys {
	return Keys{Stock: KeyOf(id, "stock"), Buyers: KeyOf(id, "buyers"), Holds: KeyOf(id, "holds")}
}

// KeyOf names another key of voucher id, in the same Redis Cluster slot as
// its stock keys (its shard's), so that one script may touch them all.
func KeyOf(id int64, name string) string {
	return ShardKey(ShardOf(id), "v"+strconv.FormatInt(id, 10)+":"+name)
}

func (k Keys) all() []string { return []string{k.Stock, k.Buyers, k.Holds} }

// indexKey lists the vouchers that have stock keys, for the sweeper.
const indexKey = "seckill:vouchers"

// Store reads and changes stock in Redis. It is safe for concurrent use.
type Store struct {
	rdb  redis.UniversalClient
	hold time.Duration
}

// NewStore returns a Store whose holds last hold: longer than any request
// can take between Take and Confirm (the order service bounds that), short
// enough that a dead process's units come back soon.
func NewStore(rdb redis.UniversalClient, hold time.Duration) *Store {
	return &Store{rdb: rdb, hold: hold}
}

// Take takes one unit for user if there is stock and user has not taken
// one, and records a hold, in one round trip.
func (s *Store) Take(ctx context.Context, voucherID, userID int64) (Result, error) {
	code, err := takeScript.Run(ctx, s.rdb, KeysOf(voucherID).all(), userID, s.hold.Milliseconds()).Int()
	if err != nil {
		return 0, fmt.Errorf("take stock of voucher %d: %w", voucherID, err)
	}
	return Result(code), nil
}

// Confirm closes user's hold once the order row is committed, and makes
// sure the user is remembered as a buyer (a reload from MySQL may have
// happened while the order was being written). It reports whether the hold
// was still open.
func (s *Store) Confirm(ctx context.Context, voucherID, userID int64) (bool, error) {
	k := KeysOf(voucherID)
	pipe := s.rdb.TxPipeline()
	removed := pipe.ZRem(ctx, k.Holds, userID)
	pipe.SAdd(ctx, k.Buyers, userID)
	if _, err := pipe.Exec(ctx); err != nil {
		return false, fmt.Errorf("confirm hold of user %d on voucher %d: %w", userID, voucherID, err)
	}
	return removed.Val() == 1, nil
}

// GiveBack returns the unit user's hold took, after the request failed.
// forget says whether to forget the user as a buyer: not when the failure
// was that the user already holds an order. It reports whether a unit went
// back (false: the hold was already gone).
func (s *Store) GiveBack(ctx context.Context, voucherID, userID int64, forget bool) (bool, error) {
	return s.giveBack(ctx, voucherID, userID, forget, false)
}

// Reclaim returns the unit of user's hold if the hold has expired: the
// process that took it died or stalled before writing the order, and the
// caller checked that no order row exists.
func (s *Store) Reclaim(ctx context.Context, voucherID, userID int64) (bool, error) {
	return s.giveBack(ctx, voucherID, userID, true, true)
}

func (s *Store) giveBack(ctx context.Context, voucherID, userID int64, forget, onlyExpired bool) (bool, error) {
	n, err := givebackScript.Run(ctx, s.rdb, KeysOf(voucherID).all(), userID, flag(forget), flag(onlyExpired)).Int()
	if err != nil {
		return false, fmt.Errorf("give back stock of voucher %d: %w", voucherID, err)
	}
	return n == 1, nil
}

func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// Expired lists up to limit users whose holds on voucher have expired.
func (s *Store) Expired(ctx context.Context, voucherID int64, limit int) ([]int64, error) {
	k := KeysOf(voucherID)
	members, err := expiredScript.Run(ctx, s.rdb, []string{k.Holds}, limit).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("list expired holds of voucher %d: %w", voucherID, err)
	}
	return parseIDs(members)
}

// Init sets a new voucher's stock and lists it for the sweeper.
func (s *Store) Init(ctx context.Context, voucherID, stock int64) error {
	k := KeysOf(voucherID)
	// A plain pipeline, not MULTI: the index lives in another cluster slot.
	pipe := s.rdb.Pipeline()
	pipe.Del(ctx, k.Buyers, k.Holds)
	pipe.Set(ctx, k.Stock, stock, 0)
	pipe.SAdd(ctx, indexKey, voucherID)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("init stock of voucher %d: %w", voucherID, err)
	}
	return nil
}

// Load rebuilds a voucher's keys from the database's figures after they
// were lost, unless another instance already did. Buyers go in first and
// the stock last: until the stock key exists every Take answers Missing, so
// no request is judged against a half-loaded set. It reports whether it
// loaded.
func (s *Store) Load(ctx context.Context, voucherID, stock int64, buyers []int64) (bool, error) {
	k := KeysOf(voucherID)
	if n, err := s.rdb.Exists(ctx, k.Stock).Result(); err != nil || n == 1 {
		return false, wrapLoad(voucherID, err)
	}
	const chunk = 1000
	for len(buyers) > 0 {
		n := min(chunk, len(buyers))
		members := make([]any, n)
		for i, id := range buyers[:n] {
			members[i] = id
		}
		if err := s.rdb.SAdd(ctx, k.Buyers, members...).Err(); err != nil {
			return false, wrapLoad(voucherID, err)
		}
		buyers = buyers[n:]
	}
	set, err := s.rdb.SetNX(ctx, k.Stock, stock, 0).Result()
	if err != nil {
		return false, wrapLoad(voucherID, err)
	}
	if err := s.rdb.SAdd(ctx, indexKey, voucherID).Err(); err != nil {
		return false, wrapLoad(voucherID, err)
	}
	return set, nil
}

func wrapLoad(voucherID int64, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("load stock of voucher %d: %w", voucherID, err)
}

// Left returns the units left; ok is false when the key is missing.
func (s *Store) Left(ctx context.Context, voucherID int64) (n int64, ok bool, err error) {
	n, err = s.rdb.Get(ctx, KeysOf(voucherID).Stock).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("read stock of voucher %d: %w", voucherID, err)
	}
	return n, true, nil
}

// Forget takes a voucher off the sweeper's list, and lets its keys (and
// others given, of the same voucher) expire after keep: its sale is over,
// and no request reads them any more (the sale window is checked first),
// but a reader of GET /vouchers may for a while.
func (s *Store) Forget(ctx context.Context, voucherID int64, keep time.Duration, others ...string) error {
	pipe := s.rdb.Pipeline()
	pipe.SRem(ctx, indexKey, voucherID)
	for _, key := range append(KeysOf(voucherID).all(), others...) {
		pipe.Expire(ctx, key, keep)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("forget voucher %d: %w", voucherID, err)
	}
	return nil
}

// Vouchers lists the vouchers that have stock keys.
func (s *Store) Vouchers(ctx context.Context) ([]int64, error) {
	members, err := s.rdb.SMembers(ctx, indexKey).Result()
	if err != nil {
		return nil, fmt.Errorf("list vouchers with stock: %w", err)
	}
	return parseIDs(members)
}

// ErrNotNow, returned by Reconcile's truth function, says the database's
// figure cannot be trusted at this moment (writes are still queued).
var ErrNotNow = errors.New("stock: not a quiet moment")

// Reconcile sets voucher's stock to the database's figure, which truth
// reads, if it drifted and nothing moved meanwhile (see reconcile.lua).
// Drift has rare causes: a Redis flush while requests were between Take
// and Confirm, or a stalled request whose hold was reclaimed before it
// committed. It reports whether it corrected anything.
func (s *Store) Reconcile(ctx context.Context, voucherID int64, truth func(context.Context) (int64, error)) (bool, error) {
	k := KeysOf(voucherID)
	pipe := s.rdb.Pipeline()
	before := pipe.Get(ctx, k.Stock)
	holds := pipe.ZCard(ctx, k.Holds)
	if _, err := pipe.Exec(ctx); errors.Is(err, redis.Nil) {
		return false, nil // no stock key: the next Take reloads it
	} else if err != nil {
		return false, fmt.Errorf("reconcile stock of voucher %d: %w", voucherID, err)
	}
	if holds.Val() > 0 {
		return false, nil
	}
	want, err := truth(ctx)
	if errors.Is(err, ErrNotNow) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	n, err := reconcileScript.Run(ctx, s.rdb, []string{k.Stock, k.Holds}, before.Val(), want).Int()
	if err != nil {
		return false, fmt.Errorf("reconcile stock of voucher %d: %w", voucherID, err)
	}
	return n == 1, nil
}

func parseIDs(members []string) ([]int64, error) {
	ids := make([]int64, 0, len(members))
	for _, m := range members {
		id, err := strconv.ParseInt(m, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("stock: malformed ID %q in Redis", m)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// Drop closes user's hold without giving its unit back, and forgets the
// user as a buyer: for when MySQL said sold out although Redis had counted
// a unit, so Redis' count was too high.
func (s *Store) Drop(ctx context.Context, voucherID, userID int64) error {
	k := KeysOf(voucherID)
	pipe := s.rdb.TxPipeline()
	pipe.ZRem(ctx, k.Holds, userID)
	pipe.SRem(ctx, k.Buyers, userID)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("drop hold of user %d on voucher %d: %w", userID, voucherID, err)
	}
	return nil
}
