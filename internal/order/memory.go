package order

import (
	"sync"
	"time"
)

// What an instance remembers, so that the flood of rejections after a sale
// costs almost nothing: facts that cannot turn false under it. What is
// only probable is never remembered: "sold out, but a request still holds
// a unit" and "bought, but the request is still writing its order" go to
// Redis every time, because those units and users may come back.
type memory struct {
	now        func() time.Time
	soldOutFor time.Duration // Config.SoldOutMemo
	soldOut    sync.Map      // voucher ID -> time.Time until which it is known sold out
	buyers     [64]buyerShard
}

func newMemory(now func() time.Time, soldOutFor time.Duration) *memory {
	return &memory{now: now, soldOutFor: soldOutFor}
}

// The buyers' memory: users who bought a voucher, so that their repeated
// clicks are answered already_ordered from memory. In sync mode the order
// is a committed row, which never goes away: the entry is kept for good.
// In async mode the order is only accepted: MySQL may still refuse it, and
// its dead letter frees the buyer to buy again (or Redis may lose it), so
// the entry lasts unsettledBuyerMemo, long enough to absorb a burst of
// clicks, short enough that a freed buyer is not turned away for long. A
// shard forgets everything when it grows past its share of maxBuyerMemo,
// to bound memory.
//
// The maps hold no pointer (keys and deadlines are numbers), so the
// garbage collector never scans a sale's hundreds of thousands of buyers,
// as it must a sync.Map's boxed keys and times.
type buyerShard struct {
	mu sync.RWMutex
	m  map[[2]int64]int64 // {voucher, user} -> Unix nanoseconds until which it holds; 0: for good
}

const (
	maxBuyerMemo       = 1 << 20
	unsettledBuyerMemo = time.Second
)

func (mem *memory) shard(voucherID, userID int64) *buyerShard {
	return &mem.buyers[uint64(userID+voucherID)%uint64(len(mem.buyers))]
}

// knownBuyer reports whether userID is known to hold an order for
// voucherID at now (the caller's clock read, which Seckill shares among
// its checks: a read of the clock is a few percent of a rejection's cost).
func (mem *memory) knownBuyer(voucherID, userID int64, now time.Time) bool {
	sh := mem.shard(voucherID, userID)
	sh.mu.RLock()
	until, ok := sh.m[[2]int64{voucherID, userID}]
	sh.mu.RUnlock()
	return ok && (until == 0 || now.UnixNano() < until)
}

// rememberBuyer remembers that userID bought voucherID; settled says the
// order is a committed row.
func (mem *memory) rememberBuyer(voucherID, userID int64, settled bool) {
	var until int64
	if !settled {
		until = mem.now().Add(unsettledBuyerMemo).UnixNano()
	}
	sh := mem.shard(voucherID, userID)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.m == nil || len(sh.m) >= maxBuyerMemo/len(mem.buyers) {
		sh.m = map[[2]int64]int64{}
	}
	sh.m[[2]int64{voucherID, userID}] = until
}

// knownSoldOut reports whether voucherID was found sold out, with no
// unit that could come back, less than SoldOutMemo before now.
func (mem *memory) knownSoldOut(voucherID int64, now time.Time) bool {
	until, ok := mem.soldOut.Load(voucherID)
	return ok && now.Before(until.(time.Time))
}

func (mem *memory) rememberSoldOut(voucherID int64) {
	if mem.soldOutFor > 0 {
		mem.soldOut.Store(voucherID, mem.now().Add(mem.soldOutFor))
	}
}
