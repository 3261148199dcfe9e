package voucher

import (
	"context"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
)

// cache keeps vouchers in memory. A voucher's title and window never change
// after creation, so an entry never goes stale; only "no such voucher" is
// remembered briefly, since another instance may create it any moment.
// singleflight makes a thousand requests for an unknown ID one query.
type cache struct {
	mu      sync.RWMutex
	found   map[int64]*Voucher
	missing map[int64]time.Time // ID -> when to ask again
	group   singleflight.Group
	now     func() time.Time
}

const (
	missingTTL = time.Second
	maxMissing = 10_000
)

func newCache(now func() time.Time) *cache {
	return &cache{found: map[int64]*Voucher{}, missing: map[int64]time.Time{}, now: now}
}

// get returns the voucher, asking load on a miss; nil means it does not
// exist.
func (c *cache) get(ctx context.Context, id int64, load func(context.Context, int64) (*Voucher, error)) (*Voucher, error) {
	c.mu.RLock()
	v, ok := c.found[id]
	until, gone := c.missing[id]
	c.mu.RUnlock()
	if ok {
		return v, nil
	}
	if gone && c.now().Before(until) {
		return nil, nil
	}
	res, err, _ := c.group.Do(strconv.FormatInt(id, 10), func() (any, error) {
		// The shared call must not die with the first caller's context.
		return load(context.WithoutCancel(ctx), id)
	})
	if err != nil {
		return nil, err
	}
	v, _ = res.(*Voucher)
	if v == nil {
		c.mu.Lock()
		if len(c.missing) >= maxMissing {
			clear(c.missing)
		}
		c.missing[id] = c.now().Add(missingTTL)
		c.mu.Unlock()
		return nil, nil
	}
	c.put(v)
	return v, nil
}

func (c *cache) put(v *Voucher) {
	c.mu.Lock()
	c.found[v.ID] = v
	delete(c.missing, v.ID)
	c.mu.Unlock()
}
