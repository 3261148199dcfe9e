package live

import (
	"bytes"
	"context"
	"encoding/json"
	"hash/maphash"
	"log/slog"
	"sync"
	"time"

	"seckill/internal/admission"
	"seckill/internal/apperr"
)

// MaxStreams bounds the event streams one instance keeps open at once.
// A stream costs a connection, a goroutine and a small write a second,
// and no read of its own (one reader per voucher serves them all), so the
// bound is on connections, well under a process's open files. Beyond it a
// page is answered 429 busy and tries again a little later.
const MaxStreams = 1000

// MaxStreamsPerClient bounds the streams of one client address: a viewer
// with a few tabs open, not one client taking all MaxStreams and telling
// every other viewer 429.
const MaxStreamsPerClient = 8

// streamsRetry is the Retry-After of a stream refused by MaxStreams: a
// stream lasts minutes, so a slot frees slowly.
const streamsRetry = 10 * time.Second

var (
	// ErrTooManyStreams refuses a stream beyond MaxStreams.
	ErrTooManyStreams = apperr.New(apperr.Busy, "this server shows as many live pages as it may; try again after Retry-After seconds")
	// ErrTooManyYours refuses a stream beyond MaxStreamsPerClient.
	ErrTooManyYours = apperr.New(apperr.Busy, "too many live pages open from your address; close one, or try again after Retry-After seconds")
)

// feeds reads each voucher's figures at most once a second on this
// instance, however many streams it has and however they come and go,
// and hands every stream the same event. A stream per reader would run
// one MySQL statement a second per open tab, on the pool that writes the
// orders: a thousand tabs, a thousand statements a second.
//
// A voucher's reader starts with its first stream and reads at once,
// then once in each slot: a second that starts 300 ms after the second
// turns (when every instance has added the last second's answers). It
// stops at a slot's start when no stream has been there since the last
// slot's: a whole second without one. Had it stopped with its last
// stream, a client opening streams one after another, never two at once,
// would start a reader, and a read, with nearly each (issue 35: ten reads
// a second instead of one). Lingering a slot, the reader serves those
// streams the event it has, and a new reader starts only more than a
// second after the last read.
type feeds struct {
	read      func(ctx context.Context, voucherID int64) (Figures, error)
	log       *slog.Logger
	quit      <-chan struct{} // closed at shutdown: the readers stop
	max       int             // streams at once; MaxStreams but in tests
	perClient int             // streams of one client at once; MaxStreamsPerClient but in tests
	opens     *admission.Buckets
	seed      maphash.Seed // of the clients' keys in opens

	mu       sync.Mutex
	open     int            // streams
	byClient map[string]int // streams by client address (web.AddrKey)
	byID     map[int64]*feed
	// ended keeps the last event of a sale that has ended, for endedFor:
	// a page opened on it meanwhile gets that event without a read (a
	// client reconnecting in a loop would otherwise cost a MySQL and a
	// Redis read per connection, and such streams end too fast for the
	// caps to hold them).
	ended map[int64]endedSale
	wg    sync.WaitGroup // the readers
}

// feed is one voucher's reader and its streams.
type feed struct {
	streams map[chan []byte]struct{} // under feeds.mu
	last    []byte                   // the last event, for a stream that joins; under feeds.mu
}

// endedSale is an ended sale's last event and when it was read.
type endedSale struct {
	event []byte
	at    time.Time
}

// endedFor is how long an ended sale's last event is served without a
// read: returns of cancelled orders may still change its figures a
// little, which a page opened later shows.
const endedFor = 10 * time.Second

// ClientOpenRate and ClientOpenBurst bound how fast one client address
// opens streams: a token bucket of ClientOpenBurst opens (the tabs of a
// viewer, or of the viewers behind one NAT, opened at once), filled at
// ClientOpenRate a second (a page's EventSource reconnects a second after
// a cut, or every streamFor). The caps bound the streams open at once,
// not how often they open; every open costs a connection, a goroutine and
// a voucher lookup, and opens on many vouchers a reader each. Per
// instance, in memory, as package admission's limits are.
const (
	ClientOpenRate  = 1.0
	ClientOpenBurst = MaxStreamsPerClient
)

// ErrOpensTooFast refuses a stream opened past ClientOpenRate.
var ErrOpensTooFast = apperr.New(apperr.Busy, "live pages opened too fast from your address; try again after Retry-After seconds")

func newFeeds(read func(context.Context, int64) (Figures, error), quit <-chan struct{}, log *slog.Logger) *feeds {
	return &feeds{read: read, log: log, quit: quit, max: MaxStreams, perClient: MaxStreamsPerClient,
		opens: admission.NewBuckets(ClientOpenRate, ClientOpenBurst, time.Now), seed: maphash.MakeSeed(),
		byClient: map[string]int{}, byID: map[int64]*feed{}, ended: map[int64]endedSale{}}
}

// opening takes one of client's opens, before anything else of a stream
// is done: ErrOpensTooFast past ClientOpenRate. admission.Buckets keys
// by number: the client's key is hashed to one (two clients sharing a
// bucket by a collision of 64 bits is not a worry).
func (fs *feeds) opening(client string) error {
	if ok, wait := fs.opens.Take(int64(maphash.String(fs.seed, client))); !ok {
		return apperr.RetryAfter(ErrOpensTooFast, wait)
	}
	return nil
}

// join opens a stream of voucherID's events: the last one at once if its
// reader has one, then each new one. A stream that falls behind gets the
// newest event, not a queue of old ones. leave closes the stream; it must
// be called, once.
func (fs *feeds) join(voucherID int64, client string) (events <-chan []byte, leave func(), err error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.byClient[client] >= fs.perClient {
		return nil, nil, apperr.RetryAfter(ErrTooManyYours, streamsRetry)
	}
	if fs.open >= fs.max {
		return nil, nil, apperr.RetryAfter(ErrTooManyStreams, streamsRetry)
	}
	fs.open++
	fs.byClient[client]++
	left := func() {
		fs.open--
		if fs.byClient[client]--; fs.byClient[client] <= 0 {
			delete(fs.byClient, client)
		}
	}
	if e, ok := fs.ended[voucherID]; ok && time.Since(e.at) < endedFor {
		ch := make(chan []byte, 1)
		ch <- e.event
		return ch, func() { fs.mu.Lock(); defer fs.mu.Unlock(); left() }, nil
	}
	f := fs.byID[voucherID]
	if f == nil {
		f = &feed{streams: map[chan []byte]struct{}{}}
		fs.byID[voucherID] = f
		fs.wg.Go(func() { fs.run(voucherID, f) })
	}
	ch := make(chan []byte, 1)
	if f.last != nil {
		ch <- f.last
	}
	f.streams[ch] = struct{}{}
	leave = func() {
		fs.mu.Lock()
		defer fs.mu.Unlock()
		left()
		delete(f.streams, ch) // the reader stops by itself once none is left
	}
	return ch, leave, nil
}

// run is voucherID's reader: it reads the figures now, then at the start
// of each slot while f has streams, and hands them to f's streams. It
// stops at a slot's start that finds no stream, for the second slot in a
// row (see feeds), or at shutdown.
//
// Once the sale has ended, its figures change no more (but for the
// returns of cancelled orders, which a new page load shows): the reader
// hands out a last event that tells the streams to end, and stops. A page
// left open on a finished sale costs no reads.
func (fs *feeds) run(voucherID int64, f *feed) {
	idle := false // no stream at the last slot's start
	for {
		fs.mu.Lock()
		if len(f.streams) > 0 {
			idle = false
		} else if idle {
			delete(fs.byID, voucherID) // the next stream starts a reader, more than a second after this read
			fs.mu.Unlock()
			return
		} else {
			idle = true
		}
		fs.mu.Unlock()
		if !idle {
			// Not cut by shutdown: the read has its own deadline.
			event, ended := fs.event(context.Background(), voucherID)
			fs.mu.Lock()
			f.last = event
			for ch := range f.streams {
				offer(ch, event)
			}
			if ended {
				now := time.Now()
				for id, e := range fs.ended { // the map holds recent ones only
					if now.Sub(e.at) >= endedFor {
						delete(fs.ended, id)
					}
				}
				fs.ended[voucherID] = endedSale{event: event, at: now}
				delete(fs.byID, voucherID) // new streams get fs.ended's event
			}
			fs.mu.Unlock()
			if ended {
				return
			}
		}
		now := time.Now()
		wait := now.Truncate(time.Second).Add(time.Second + 300*time.Millisecond).Sub(now)
		select {
		case <-fs.quit:
			fs.mu.Lock()
			delete(fs.byID, voucherID)
			fs.mu.Unlock()
			return
		case <-time.After(wait):
		}
	}
}

// offer puts event in ch, in place of an event the stream has not taken.
func offer(ch chan []byte, event []byte) {
	select {
	case <-ch:
	default:
	}
	ch <- event // the reader alone sends, under feeds.mu: there is room
}

// endedEvent follows the last figures of a sale that has ended: the
// stream closes after it, and the page stops its EventSource, which would
// otherwise open a new stream a second later.
const endedEvent = "event: ended\ndata: {}\n\n"

// event reads the figures, as an event: figures, or trouble, which the
// page shows while the stream goes on. ended: the sale is over, and the
// event is its last (endedEvent follows the figures).
func (fs *feeds) event(ctx context.Context, voucherID int64) (event []byte, ended bool) {
	rctx, cancel := context.WithTimeout(ctx, 900*time.Millisecond)
	f, err := fs.read(rctx, voucherID)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			fs.log.WarnContext(ctx, "live: read the sale", "voucher", voucherID, "err", err)
		}
		// The cause stays in the log: the page is public.
		return []byte("event: trouble\ndata: {\"message\": \"cannot read the sale now: MySQL or Redis did not answer\"}\n\n"), false
	}
	data, _ := json.Marshal(f)
	event = append(append([]byte("event: figures\ndata: "), data...), "\n\n"...)
	if f.Ended {
		event = append(event, endedEvent...)
	}
	return event, f.Ended
}

// last reports whether event is the last of its stream.
func last(event []byte) bool { return bytes.HasSuffix(event, []byte(endedEvent)) }
