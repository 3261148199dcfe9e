package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeServer speaks as much of docs/api.md as a rehearsal uses, and can be
// told to lie or to stall, so that the tests know what the report must
// find. It sells one voucher at a time, in memory.
type fakeServer struct {
	// Lies and troubles, set before the run.
	noOrderEvery    int           // every n-th 200 carries an order that does not exist
	busyOrderEvery  int           // every n-th sale is answered 429 busy, yet taken
	soldOutOrder    bool          // a user told sold_out is given an order all the same (without a unit)
	oversell        int           // sells this many units past the stock
	stallFrom       time.Duration // requests arriving in [stallFrom, stallTo) of the sale
	stallTo         time.Duration // are held until stallTo
	withoutLiveFigs bool          // no /live/{id}/events
	// Async mode: an order reads pending for pendingFor, then unpaid, or
	// failed for every failEvery-th sale (its unit and buyer given back).
	pendingFor  time.Duration
	failEvery   int
	ordersFlaky int  // each order's first n GETs are answered 503
	ordersDown  bool // every GET /orders is answered 503
	twoPerUser  bool // never answers already_ordered: a user may buy again
	// Every hangEvery-th sale is taken, and answered hangFor later.
	hangEvery int
	hangFor   time.Duration
	// An address may open a live stream once per liveOpenEvery, and is
	// answered 429 with Retry-After before that.
	liveOpenEvery time.Duration
	joinFlaky     int // each user's first n joins of the room are answered 503, Retry-After: 1

	mu      sync.Mutex
	room    *fakeRoom // the voucher's waiting room, if it has one
	joins   map[string]int
	users   map[string]string // token -> user ID
	nextID  int
	voucher struct {
		id           string
		stock, left  int64
		begin, end   time.Time
		sold, orders int
	}
	orders  map[string]*fakeOrder // order ID -> order
	byUser  map[string]string     // user ID -> order ID
	answers map[string]int64
	gets    map[string]int // GET /orders/{id} asked, by ID
	// The live streams: opened, refused with 429, and when last opened.
	liveOpens, liveRefused int
	liveOpened             time.Time
}

// fakeRoom is a waiting room as docs/api.md has it, simply: numbers in
// the order of joining, admitted at rate a second from the start while a
// unit is neither sold nor held, each hold lasting hold.
type fakeRoom struct {
	rate     int
	hold     time.Duration
	line     []string             // user IDs, in the order they joined
	admitted map[string]time.Time // user ID -> when
}

// place is a user's place in the room, admitting whom the rate allows
// first; f.mu is held.
func (f *fakeServer) place(user string) map[string]any {
	rm, now := f.room, time.Now()
	held := int64(0)
	for u, at := range rm.admitted {
		if f.byUser[u] == "" && now.Sub(at) < rm.hold {
			held++
		}
	}
	if now.After(f.voucher.begin) {
		allowed := int(float64(rm.rate)*now.Sub(f.voucher.begin).Seconds()) + 1
		for i, u := range rm.line {
			if i >= allowed || f.voucher.left-held <= 0 {
				break
			}
			if _, ok := rm.admitted[u]; !ok && f.byUser[u] == "" {
				rm.admitted[u] = now
				held++
			}
		}
	}
	n := slices.Index(rm.line, user)
	p := map[string]any{"state": "waiting", "number": strconv.Itoa(n + 1), "ahead": nil, "eta_seconds": nil, "admitted_until": nil}
	at, admitted := rm.admitted[user]
	switch {
	case n < 0:
		p["state"], p["number"] = "none", nil
	case f.byUser[user] != "":
		p["state"] = "ordered"
	case admitted && now.Sub(at) < rm.hold:
		p["state"], p["admitted_until"] = "admitted", at.Add(rm.hold)
	case admitted:
		p["state"] = "expired"
	case f.voucher.left-held <= 0:
		p["state"] = "sold_out"
	}
	return p
}

type fakeOrder struct {
	user    string
	created time.Time
	state   string // pending, unpaid or failed
	fail    bool   // ends failed
}

// settle moves the pending orders whose time has come on; f.mu is held.
func (f *fakeServer) settle() {
	for _, o := range f.orders {
		if o.state != "pending" || time.Since(o.created) < f.pendingFor {
			continue
		}
		o.state = "unpaid"
		if o.fail {
			o.state = "failed"
			f.voucher.left++
			delete(f.byUser, o.user)
		}
	}
}

// count counts the orders in state; f.mu is held.
func (f *fakeServer) count(state string) int64 {
	n := int64(0)
	for _, o := range f.orders {
		if o.state == state {
			n++
		}
	}
	return n
}

const fakeAdmin = "admin-token"

func newFakeServer(t *testing.T, configure func(*fakeServer)) *httptest.Server {
	t.Helper()
	f := &fakeServer{users: map[string]string{}, orders: map[string]*fakeOrder{}, byUser: map[string]string{}, answers: map[string]int64{}, gets: map[string]int{}, joins: map[string]int{}}
	if configure != nil {
		configure(f)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /auth/code", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, map[string]any{"sent": true, "code": "123456"})
	})
	mux.HandleFunc("POST /auth/login", func(w http.ResponseWriter, r *http.Request) {
		var in struct{ Phone string }
		json.NewDecoder(r.Body).Decode(&in)
		f.mu.Lock()
		f.nextID++
		id := strconv.Itoa(f.nextID)
		tok := "tok-" + id
		f.users[tok] = id
		f.mu.Unlock()
		writeJSON(w, 200, map[string]any{"token": tok, "user": map[string]string{"id": id, "phone": in.Phone}})
	})
	mux.HandleFunc("POST /vouchers", func(w http.ResponseWriter, r *http.Request) {
		if bearer(r) != fakeAdmin {
			writeErr(w, 403, "forbidden")
			return
		}
		var in struct {
			Stock int64
			Begin time.Time `json:"begin_time"`
			End   time.Time `json:"end_time"`
			Room  *struct {
				Rate int `json:"admit_per_second"`
				Hold int `json:"hold_for"`
			}
		}
		json.NewDecoder(r.Body).Decode(&in)
		f.mu.Lock()
		if in.Room != nil {
			f.room = &fakeRoom{rate: in.Room.Rate, hold: time.Duration(in.Room.Hold) * time.Second, admitted: map[string]time.Time{}}
		}
		f.voucher.id, f.voucher.stock, f.voucher.left = "7", in.Stock, in.Stock
		f.voucher.begin, f.voucher.end = in.Begin.Truncate(time.Second), in.End.Truncate(time.Second)
		f.mu.Unlock()
		writeJSON(w, 201, f.voucherJSON())
	})
	mux.HandleFunc("GET /vouchers/{id}", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, f.voucherJSON())
	})
	mux.HandleFunc("POST /seckill/{id}", f.seckill)
	mux.HandleFunc("POST /vouchers/{id}/room", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		user, ok := f.users[bearer(r)]
		switch {
		case !ok:
			writeErr(w, 401, "unauthorized")
		case f.room == nil:
			writeErr(w, 404, "not_found")
		case f.joins[user] < f.joinFlaky:
			f.joins[user]++
			w.Header().Set("Retry-After", "1")
			writeErr(w, 503, "unavailable")
		case f.byUser[user] != "":
			writeErr(w, 409, "already_ordered")
		default:
			if !slices.Contains(f.room.line, user) {
				f.room.line = append(f.room.line, user)
			}
			writeJSON(w, 200, f.place(user))
		}
	})
	mux.HandleFunc("GET /vouchers/{id}/room/events", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		user, ok := f.users[bearer(r)]
		f.mu.Unlock()
		if !ok {
			writeErr(w, 401, "unauthorized")
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		last := ""
		for {
			f.mu.Lock()
			p := f.place(user)
			f.mu.Unlock()
			if st := p["state"].(string); st != last {
				last = st
				b, _ := json.Marshal(p)
				fmt.Fprintf(w, "event: place\ndata: %s\n\n", b)
				w.(http.Flusher).Flush()
			}
			select {
			case <-r.Context().Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
	mux.HandleFunc("GET /orders/{id}", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.settle()
		id := r.PathValue("id")
		f.gets[id]++
		if f.ordersDown || f.gets[id] <= f.ordersFlaky {
			writeErr(w, 503, "unavailable")
			return
		}
		o, ok := f.orders[id]
		if !ok || f.users[bearer(r)] != o.user {
			writeErr(w, 404, "not_found")
			return
		}
		writeJSON(w, 200, map[string]any{"id": id, "user_id": o.user, "voucher_id": f.voucher.id, "status": o.state, "created_at": o.created})
	})
	mux.HandleFunc("GET /live/{id}/events", func(w http.ResponseWriter, r *http.Request) {
		if f.withoutLiveFigs {
			writeErr(w, 404, "not_found")
			return
		}
		f.mu.Lock()
		if wait := f.liveOpenEvery - time.Since(f.liveOpened); f.liveOpenEvery > 0 && wait > 0 {
			f.liveRefused++
			f.mu.Unlock()
			w.Header().Set("Retry-After", strconv.Itoa(int((wait+time.Second-1)/time.Second)))
			writeErr(w, 429, "busy")
			return
		}
		f.liveOpens++
		f.liveOpened = time.Now()
		f.mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "retry: 1000\n\n")
		// One event at once, then one every 250 ms (the server's are a
		// second apart), until the client leaves.
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			f.mu.Lock()
			f.settle()
			pending, orders := f.count("pending"), f.count("unpaid")
			fig := map[string]any{"initial": f.voucher.stock, "redis_left": f.voucher.left, "mysql_left": f.voucher.left + pending,
				"orders": orders, "invariant_holds": f.voucher.left+pending+orders == f.voucher.stock,
				"total": f.answers, "queue": nil}
			if f.pendingFor > 0 {
				fig["queue"] = pending
			}
			b, _ := json.Marshal(fig)
			f.mu.Unlock()
			fmt.Fprintf(w, "event: figures\ndata: %s\n\n", b)
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-tick.C:
			}
		}
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func (f *fakeServer) voucherJSON() map[string]any {
	f.mu.Lock()
	defer f.mu.Unlock()
	v := map[string]any{"id": f.voucher.id, "title": "t", "stock": max(f.voucher.left, 0),
		"begin_time": f.voucher.begin.Format(time.RFC3339), "end_time": f.voucher.end.Format(time.RFC3339)}
	if f.room != nil {
		v["room"] = map[string]any{"state": "open", "serving": "0", "waiting": len(f.room.line) - len(f.room.admitted)}
	}
	return v
}

// seckill is the buy button, in the contract's order of checks, with the
// configured lies.
func (f *fakeServer) seckill(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	f.mu.Lock()
	user, ok := f.users[bearer(r)]
	begin := f.voucher.begin
	f.mu.Unlock()
	if !ok {
		writeErr(w, 401, "unauthorized")
		return
	}
	if at := arrived.Sub(begin); f.stallTo > f.stallFrom && at >= f.stallFrom && at < f.stallTo {
		time.Sleep(f.stallTo - at)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.settle()
	answer := func(status int, code string) {
		f.answers[code]++
		writeErr(w, status, code)
	}
	switch {
	case arrived.Before(begin):
		answer(409, "not_started")
	case f.byUser[user] != "" && !f.twoPerUser:
		answer(409, "already_ordered")
	case f.room != nil && f.place(user)["state"] != "admitted":
		answer(409, "not_admitted")
	case f.voucher.left <= -int64(f.oversell) || (f.voucher.left <= 0 && f.oversell == 0):
		if f.soldOutOrder && f.byUser[user] == "" {
			f.order(user)
		}
		answer(409, "sold_out")
	default:
		f.voucher.left--
		id := f.order(user)
		f.voucher.sold++
		if f.busyOrderEvery > 0 && f.voucher.sold%f.busyOrderEvery == 0 {
			w.Header().Set("Retry-After", "1")
			answer(429, "busy")
			return
		}
		if f.noOrderEvery > 0 && f.voucher.sold%f.noOrderEvery == 0 {
			delete(f.orders, id) // the 200 below announces an order that is not there
		}
		if o := f.orders[id]; o != nil && f.pendingFor > 0 {
			o.state, o.fail = "pending", f.failEvery > 0 && f.voucher.sold%f.failEvery == 0
		}
		if f.hangEvery > 0 && f.voucher.sold%f.hangEvery == 0 {
			f.mu.Unlock()
			time.Sleep(f.hangFor) // the answer comes after the client gave up
			f.mu.Lock()
		}
		f.answers["ok"]++
		writeJSON(w, 200, map[string]string{"order_id": id})
	}
}

// order records an order of user; f.mu is held.
func (f *fakeServer) order(user string) string {
	id := strconv.Itoa(1_000_000 + len(f.orders) + f.voucher.sold)
	for f.orders[id] != nil {
		id += "1"
	}
	f.orders[id] = &fakeOrder{user: user, created: time.Now(), state: "unpaid"}
	f.byUser[user] = id
	return id
}

func bearer(r *http.Request) string {
	return strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, status int, code string) {
	writeJSON(w, status, map[string]any{"error": map[string]string{"code": code, "message": code}})
}
