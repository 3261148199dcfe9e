package room

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"seckill/internal/apperr"
)

// MaxStreams bounds the room event streams one instance keeps open, and
// MaxStreamsPerUser those of one buyer (a few tabs).
const (
	MaxStreams        = 20_000
	MaxStreamsPerUser = 3
)

var (
	errTooManyStreams = apperr.RetryAfter(apperr.New(apperr.Busy, "this server follows as many waiting buyers as it may; try again after Retry-After seconds"), 5*time.Second)
	errTooManyYours   = apperr.RetryAfter(apperr.New(apperr.Busy, "you follow this room from too many places; close one"), 5*time.Second)
)

// readEvery is how often an instance reads a room's figures for its
// streams: a buyer learns of a change within it (the contract gives a
// second).
const readEvery = 500 * time.Millisecond

// feeds reads each room's figures once per readEvery on this instance,
// whatever the number of its streams, and tells every stream.
type feeds struct {
	store *Store
	log   *slog.Logger

	mu     sync.Mutex
	open   int
	byUser map[int64]int
	byID   map[int64]*feed
}

// feed is one room's reader and what it last read.
type feed struct {
	streams int // under feeds.mu
	stop    context.CancelFunc

	mu   sync.Mutex
	last snapshot
	tick chan struct{} // closed when a new read is in; replaced
}

func newFeeds(store *Store, log *slog.Logger) *feeds {
	return &feeds{store: store, log: log, byUser: map[int64]int{}, byID: map[int64]*feed{}}
}

// join subscribes a stream of user to sale's room; leave must be called,
// once.
func (fs *feeds) join(sale Sale, user int64) (*feed, func(), error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.byUser[user] >= MaxStreamsPerUser {
		return nil, nil, errTooManyYours
	}
	if fs.open >= MaxStreams {
		return nil, nil, errTooManyStreams
	}
	fs.open++
	fs.byUser[user]++
	f := fs.byID[sale.VoucherID]
	if f == nil {
		ctx, stop := context.WithCancel(context.Background())
		f = &feed{stop: stop, tick: make(chan struct{})}
		fs.byID[sale.VoucherID] = f
		go fs.run(ctx, sale, f)
	}
	f.streams++
	return f, func() {
		fs.mu.Lock()
		defer fs.mu.Unlock()
		fs.open--
		if fs.byUser[user]--; fs.byUser[user] <= 0 {
			delete(fs.byUser, user)
		}
		if f.streams--; f.streams == 0 {
			f.stop()
			delete(fs.byID, sale.VoucherID)
		}
	}, nil
}

// run reads the room's figures every readEvery until ctx ends.
func (fs *feeds) run(ctx context.Context, sale Sale, f *feed) {
	t := time.NewTicker(readEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		snap, err := fs.store.read(ctx, sale, "")
		if err != nil {
			// A stock key gone is put back by the next join or read of a
			// place, or during the sale by the admitter's next round: not
			// worth a line each tick meanwhile.
			if ctx.Err() == nil && !errors.Is(err, ErrStockMissing) {
				fs.log.WarnContext(ctx, "room: read the figures", "voucher", sale.VoucherID, "err", err)
			}
			continue
		}
		f.mu.Lock()
		f.last = snap
		close(f.tick)
		f.tick = make(chan struct{})
		f.mu.Unlock()
	}
}

// changed is closed when the next read is in.
func (f *feed) changed() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tick
}

// figures is the last read.
func (f *feed) figures() snapshot {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
