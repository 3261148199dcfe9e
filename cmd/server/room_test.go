package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"seckill/internal/room"
	"seckill/internal/stock"
	"seckill/internal/testenv"
	"seckill/internal/testenv/faultproxy"
)

// A sale through a waiting room on three instances, in both modes, on the
// real MariaDB and Redis. 150 buyers: 120 join before begin_time, 30 after;
// each polls its place on any instance and presses once admitted, but one
// in five never presses (its hold ends and its unit goes to the next
// number), one in ten of the buyers cancels (the unit comes back and
// admits the next), and 20 press before they are admitted. Afterwards:
//
//   - the seed matches the commitment published at creation, and the
//     numbers of those who joined before begin_time are the draw's;
//   - admission followed the numbers: every buyer admitted (ordered,
//     holding, or whose hold ended) has a number at most the room's
//     serving, and every one still waiting a higher one;
//   - the room never admitted faster than its rate (serving sampled every
//     100 ms: within admit_per_second * (t + 1));
//   - no admitted buyer was told sold_out; everyone else's press was
//     not_admitted, and made no order;
//   - at rest, the lifecycle's invariants hold, and every order belongs to
//     an admitted buyer.
func TestWaitingRoomSale(t *testing.T) {
	for _, mode := range []string{"sync", "async"} {
		t.Run(mode, func(t *testing.T) {
			redisDB := 0
			if mode == "async" {
				redisDB = 10 // the orders streams are one per Redis database
			}
			st := newStack(t, redisDB)
			insts := startMany(t, st, 3, "SECKILL_MODE", mode)
			admin, _ := mustLogin(t, insts[0].Base, adminPhone)
			users := loginMany(t, insts[0].Base, 150)
			const units, rate, hold = 40, 20, 5
			begin := time.Now().Add(4 * time.Second).Truncate(time.Second)
			vid := createVoucher(t, insts[0].Base, admin, units, begin, begin.Add(time.Hour),
				"room", map[string]any{"admit_per_second": rate, "hold_for": hold})
			v := mustCall(t, "GET", insts[1].Base+"/vouchers/"+vid, "", nil)
			rm, _ := v.Body["room"].(map[string]any)
			commitment, _ := rm["commitment"].(string)
			if rm["seed"] != nil || len(commitment) != 64 || rm["state"] != "open" {
				t.Fatalf("the room before begin_time: %s", v.Raw)
			}

			// Joins: 120 before begin_time, on any instance.
			inst := func() string { return insts[rand.IntN(len(insts))].Base }
			var wg sync.WaitGroup
			for _, u := range users[:120] {
				wg.Go(func() {
					if r, err := call("POST", inst()+"/vouchers/"+vid+"/room", u.Token, nil); err != nil || r.Status != 200 {
						t.Errorf("join before begin_time: %v %s", err, r.Raw)
					}
				})
			}
			wg.Wait()
			if time.Now().After(begin) {
				t.Fatal("the joins took past begin_time; the test needs a later start")
			}

			// The room's serving, sampled for the rate bound.
			var servingMu sync.Mutex
			type sample struct {
				at      time.Time
				serving int64
			}
			var samples []sample
			done := make(chan struct{})
			var watch sync.WaitGroup
			watch.Go(func() {
				for {
					select {
					case <-done:
						return
					case <-time.After(100 * time.Millisecond):
					}
					r, err := call("GET", inst()+"/vouchers/"+vid, "", nil)
					if err != nil || r.Status != 200 {
						continue
					}
					rm, _ := r.Body["room"].(map[string]any)
					s, _ := rm["serving"].(string)
					n, _ := strconv.ParseInt(s, 10, 64)
					servingMu.Lock()
					samples = append(samples, sample{time.Now(), n})
					servingMu.Unlock()
				}
			})

			// The buyers.
			var l ledger
			var mu sync.Mutex
			admittedSoldOut, earlyPresses := 0, 0
			pressers := map[string]bool{}
			deadline := begin.Add(12 * time.Second)
			for i, u := range users {
				wg.Go(func() {
					if i >= 120 { // joins after begin_time
						time.Sleep(time.Until(begin) + time.Duration(rand.IntN(1500))*time.Millisecond)
						if r, err := call("POST", inst()+"/vouchers/"+vid+"/room", u.Token, nil); err != nil || (r.Status != 200 && r.Code() != "sold_out") {
							t.Errorf("join after begin_time: %v %s", err, r.Raw)
							return
						}
					}
					if i%7 == 0 { // presses before being admitted
						time.Sleep(time.Until(begin) + time.Duration(rand.IntN(2000))*time.Millisecond)
						// Only a buyer whose turn is more than two seconds
						// of admissions away (the rate, and a second's
						// saved credit): one closer may be admitted between
						// the look and the press, and rightly sold to.
						r, _ := call("GET", inst()+"/vouchers/"+vid+"/room", u.Token, nil)
						if ahead, ok := r.Body["ahead"].(float64); ok && r.Str("state") == room.StateWaiting && ahead > 2*rate {
							o := buy(&l, inst(), u, vid)
							mu.Lock()
							earlyPresses++
							mu.Unlock()
							if o.Status == 200 || (o.Code != "not_admitted" && o.Code != "not_started") {
								t.Errorf("a press before admission: %d %s", o.Status, o.Code)
							}
						}
					}
					for time.Now().Before(deadline) {
						time.Sleep(150 * time.Millisecond)
						r, err := call("GET", inst()+"/vouchers/"+vid+"/room", u.Token, nil)
						if err != nil || r.Status != 200 {
							continue
						}
						switch r.Str("state") {
						case room.StateExpired, room.StateOrdered:
							return
						case room.StateAdmitted:
							if i%5 == 4 {
								continue // never presses: the hold ends
							}
							o := buy(&l, inst(), u, vid)
							mu.Lock()
							pressers[u.ID] = true
							if o.Code == "sold_out" {
								admittedSoldOut++
							}
							mu.Unlock()
							if o.Status == 200 && i%10 == 3 {
								if r, err := call("POST", inst()+"/orders/"+o.OrderID+"/cancel", u.Token, nil); err != nil || (r.Status != 200 && r.Code() != "invalid_state") {
									t.Errorf("cancel: %v %s", err, r.Raw)
								}
							}
							if o.Status == 200 || o.Code == "already_ordered" {
								return
							}
						}
					}
				})
			}
			wg.Wait()
			close(done)
			watch.Wait()

			if admittedSoldOut > 0 {
				t.Errorf("%d admitted buyers were told sold_out", admittedSoldOut)
			}
			if earlyPresses == 0 {
				t.Error("no press before admission was tried")
			}
			won := l.wins(t)
			if len(won) < units/2 {
				t.Errorf("only %d buyers won %d units", len(won), units)
			}

			// The rate bound, on the samples.
			for i := range samples {
				for j := i + 1; j < len(samples); j++ {
					dt := samples[j].at.Sub(samples[i].at).Seconds()
					// +0.3 s: a sample's answer is a moment old.
					if got, bound := samples[j].serving-samples[i].serving, int64(rate*(dt+0.3+1)); got > bound {
						t.Fatalf("serving went up %d in %.2f s, over %d a second", got, dt, rate)
					}
				}
			}

			// The draw: the seed matches the commitment, and the numbers
			// are the HMAC order of those who joined before begin_time.
			v = mustCall(t, "GET", insts[2].Base+"/vouchers/"+vid, "", nil)
			rm, _ = v.Body["room"].(map[string]any)
			seedHex, _ := rm["seed"].(string)
			seed, err := hex.DecodeString(seedHex)
			if sum := sha256.Sum256(seed); err != nil || hex.EncodeToString(sum[:]) != commitment {
				t.Fatalf("seed %q does not match the commitment %s", seedHex, commitment)
			}
			// The room goes on admitting while the places are read: a
			// number admitted is at most serving read after, and a
			// number waiting above serving read before.
			before, _ := strconv.ParseInt(rm["serving"].(string), 10, 64)
			ids := make([]int64, 120)
			byID := map[int64]user{}
			for i, u := range users {
				id, _ := strconv.ParseInt(u.ID, 10, 64)
				byID[id] = u
				if i < 120 {
					ids[i] = id
				}
			}
			admitted := map[string]bool{}
			type check struct {
				user, number int64
				state        string
			}
			var checks []check
			for i, id := range room.Draw(seed, ids) {
				r := placeOf(t, inst()+"/vouchers/"+vid+"/room", byID[id].Token)
				number, _ := strconv.ParseInt(r.Str("number"), 10, 64)
				state := r.Str("state")
				// A buyer whose hold ended and who joined again has a
				// later number; nobody here joins again.
				if number != int64(i+1) {
					t.Errorf("user %d: number %d, want the draw's %d (%d %s)", id, number, i+1, r.Status, r.Raw)
				}
				if state == room.StateAdmitted || state == room.StateExpired || state == room.StateOrdered {
					admitted[byID[id].ID] = true
				}
				checks = append(checks, check{id, number, state})
			}
			v = mustCall(t, "GET", insts[2].Base+"/vouchers/"+vid, "", nil)
			rm, _ = v.Body["room"].(map[string]any)
			after, _ := strconv.ParseInt(rm["serving"].(string), 10, 64)
			for _, c := range checks {
				switch c.state {
				case room.StateAdmitted, room.StateExpired, room.StateOrdered:
					if c.number > after {
						t.Errorf("user %d (%s) has number %d above serving %d", c.user, c.state, c.number, after)
					}
				case room.StateWaiting, room.StateSoldOut:
					if c.number <= before {
						t.Errorf("user %d is still %s with number %d, at or below serving %d", c.user, c.state, c.number, before)
					}
				}
			}
			for _, u := range users[120:] {
				if r := placeOf(t, inst()+"/vouchers/"+vid+"/room", u.Token); r.Str("state") != room.StateNone && r.Str("state") != room.StateWaiting && r.Str("state") != room.StateSoldOut {
					admitted[u.ID] = true
				}
			}

			// The live page shows the line.
			if line := liveRoom(t, insts[0].Base, vid); line["commitment"] != commitment || line["seed"] != seedHex || line["serving"] == nil || line["held"] == nil {
				t.Errorf("the live page's room: %v", line)
			}

			// At rest: the lifecycle's invariants, and every order an
			// admitted buyer's.
			db, rdb := testenv.Open(t, st.DSN), testenv.Redis(t, st.RedisDB)
			s := waitRest(t, db, rdb, vid, 15*time.Second)
			checkCounts(t, s)
			holding := s.Rows.Sold - s.Rows.Cancelled - s.Rows.Refunded
			if s.Stock < 0 || s.Stock+holding != units {
				t.Errorf("stock %d + orders holding a unit %d, want %d", s.Stock, holding, units)
			}
			for id, owner := range s.Orders {
				if !admitted[strconv.FormatInt(owner, 10)] {
					t.Errorf("order %s belongs to user %d, never admitted", id, owner)
				}
			}
			for u, id := range won {
				if owner, ok := s.Orders[id]; !ok || strconv.FormatInt(owner, 10) != u {
					t.Errorf("200 to user %s with order %s: row %v", u, id, ok)
				}
			}
			for u, n := range s.Users {
				if n > 1 {
					t.Errorf("user %d holds %d orders", u, n)
				}
			}
			if got := l.count(http.StatusConflict, "not_admitted"); got == 0 {
				t.Error("no press was answered not_admitted")
			}
			t.Logf("%s: %d won, %d cancelled, serving %d of %d numbers, %d pressed; room %v", mode, len(won), s.Rows.Cancelled, after, 120+30, len(pressers), rm)
			codes := map[string]int{}
			for _, o := range l.all {
				codes[strconv.Itoa(o.Status)+" "+o.Code]++
			}
			t.Logf("answers: %v", codes)
		})
	}
}

// placeOf reads a buyer's place, again if an instance was too busy to
// answer (the race detector slows them ten times).
func placeOf(t *testing.T, url, token string) reply {
	t.Helper()
	var r reply
	for range 5 {
		r = mustCall(t, "GET", url, token, nil)
		if r.Status == http.StatusOK {
			return r
		}
		t.Logf("GET %s: %d %s", url, r.Status, r.Raw)
		time.Sleep(200 * time.Millisecond)
	}
	return r
}

// liveRoom reads the first figures of the live page's stream of voucher
// vid and returns their room.
func liveRoom(t *testing.T, base, vid string) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/live/"+vid+"/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			var f struct {
				Room map[string]any `json:"room"`
			}
			if err := json.Unmarshal([]byte(data), &f); err != nil {
				t.Fatal(err)
			}
			return f.Room
		}
	}
	t.Fatalf("no figures from the live stream: %v", sc.Err())
	return nil
}

// A Redis that restarts empty in the middle of a sale with a room: the
// line is gone, but not the sale. The Admitter lists the rooms from MySQL
// and puts the stock back; the buyers who bought are refused a place
// (their orders are in MySQL), the others join again and are admitted;
// nobody buys twice and nothing is oversold.
func TestWaitingRoomAfterRedisEmptied(t *testing.T) {
	st := newStack(t, 13)
	in := start(t, st.env(freeAddr(t)))
	admin, _ := mustLogin(t, in.Base, adminPhone)
	users := loginMany(t, in.Base, 8)
	const units = 5
	begin := time.Now().Add(2 * time.Second).Truncate(time.Second)
	vid := createVoucher(t, in.Base, admin, units, begin, begin.Add(time.Hour), "room", map[string]any{"admit_per_second": 100, "hold_for": 5})
	join := func(u user) reply {
		t.Helper()
		return mustCall(t, "POST", in.Base+"/vouchers/"+vid+"/room", u.Token, nil)
	}
	for _, u := range users {
		if r := join(u); r.Status != http.StatusOK {
			t.Fatalf("join: %s", r.Raw)
		}
	}
	// buyUntil has every buyer press once admitted, until deadline.
	var l ledger
	buyUntil := func(deadline time.Time) {
		var wg sync.WaitGroup
		for _, u := range users {
			wg.Go(func() {
				for time.Now().Before(deadline) {
					if r, err := call("GET", in.Base+"/vouchers/"+vid+"/room", u.Token, nil); err == nil && r.Str("state") == room.StateAdmitted {
						if o := buy(&l, in.Base, u, vid); o.Status == 200 || o.Code == "already_ordered" {
							return
						}
					}
					time.Sleep(100 * time.Millisecond)
				}
			})
		}
		wg.Wait()
	}
	time.Sleep(time.Until(begin))
	// Two buy, then Redis loses everything.
	var wg sync.WaitGroup
	for _, u := range users[:2] {
		wg.Go(func() {
			for range 30 {
				if r, _ := call("GET", in.Base+"/vouchers/"+vid+"/room", u.Token, nil); r.Str("state") == room.StateAdmitted {
					buy(&l, in.Base, u, vid)
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	if err := testenv.Redis(t, st.RedisDB).FlushDB(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	bought := map[string]bool{}
	for u := range l.wins(t) {
		bought[u] = true
	}
	// The admitter goes on at 100 a second while they join again: once
	// those who joined hold every unit left, the room is sold out to the
	// rest (no unit neither sold nor held), as it should be.
	joined := 0
	for _, u := range users {
		r := join(u)
		switch {
		case bought[u.ID] && r.Code() != "already_ordered":
			t.Errorf("a buyer joins after Redis lost the line: %d %s, want already_ordered", r.Status, r.Raw)
		case bought[u.ID]:
		case r.Status == http.StatusOK:
			joined++
		case r.Code() == "sold_out" && joined >= units-len(bought):
		default:
			t.Errorf("join again after Redis lost the line (%d joined before, %d units left): %d %s", joined, units-len(bought), r.Status, r.Raw)
		}
	}
	buyUntil(time.Now().Add(8 * time.Second))
	won := l.wins(t)
	if len(won) != units {
		t.Errorf("%d units sold of %d after Redis came back empty", len(won), units)
	}
	db := testenv.Open(t, st.DSN)
	s := waitRest(t, db, testenv.Redis(t, st.RedisDB), vid, 10*time.Second)
	checkInvariants(t, s, units, won)
}

// A room's admitters on three server processes: one is SIGKILLed and one
// SIGSTOPped for two seconds just as admission starts. Admission is one
// script in Redis, so there is nothing half done to leave behind: the
// survivor admits at the room's rate, the paused one, woken, admits no
// one twice and no number out of turn, and the sale sells every unit to
// admitted buyers only.
func TestWaitingRoomAdmittersKilledAndPaused(t *testing.T) {
	st := newStack(t, 0)
	killed := spawn(t, st.env(freeAddr(t)))
	paused := spawn(t, st.env(freeAddr(t)))
	survivor := spawn(t, st.env(freeAddr(t)))
	admin, _ := mustLogin(t, survivor.Base, adminPhone)
	users := loginMany(t, survivor.Base, 40)
	const units, rate = 15, 10
	begin := time.Now().Add(3 * time.Second).Truncate(time.Second)
	vid := createVoucher(t, survivor.Base, admin, units, begin, begin.Add(time.Hour), "room", map[string]any{"admit_per_second": rate, "hold_for": 5})
	for _, u := range users {
		if r := mustCall(t, "POST", survivor.Base+"/vouchers/"+vid+"/room", u.Token, nil); r.Status != http.StatusOK {
			t.Fatalf("join: %s", r.Raw)
		}
	}
	time.Sleep(time.Until(begin) + 50*time.Millisecond)
	if err := killed.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := paused.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(2 * time.Second)
		paused.cmd.Process.Signal(syscall.SIGCONT)
	}()
	t.Cleanup(func() { paused.cmd.Process.Signal(syscall.SIGCONT) })

	var l ledger
	var mu sync.Mutex
	soldOut := 0
	var wg sync.WaitGroup
	deadline := time.Now().Add(12 * time.Second)
	start := time.Now()
	for _, u := range users {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				time.Sleep(150 * time.Millisecond)
				r, err := call("GET", survivor.Base+"/vouchers/"+vid+"/room", u.Token, nil)
				if err != nil || r.Str("state") != room.StateAdmitted {
					if r.Str("state") == room.StateOrdered {
						return
					}
					continue
				}
				o := buy(&l, survivor.Base, u, vid)
				mu.Lock()
				if o.Code == "sold_out" {
					soldOut++
				}
				mu.Unlock()
				if o.Status == http.StatusOK {
					return
				}
			}
		})
	}
	// The rate held across the pause: serving never ran ahead of it.
	for time.Now().Before(deadline) {
		r := mustCall(t, "GET", survivor.Base+"/vouchers/"+vid, "", nil)
		rm, _ := r.Body["room"].(map[string]any)
		s, _ := rm["serving"].(string)
		n, _ := strconv.ParseInt(s, 10, 64)
		if bound := int64(rate * (time.Since(start).Seconds() + 1.3)); n > bound {
			t.Errorf("serving %d %.1f s after the start, over %d a second", n, time.Since(start).Seconds(), rate)
			break
		}
		if n >= units && l.count(http.StatusOK, "") >= units {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	wg.Wait()
	if soldOut > 0 {
		t.Errorf("%d admitted buyers were told sold_out", soldOut)
	}
	won := l.wins(t)
	if len(won) != units {
		t.Errorf("%d of %d units sold with one admitter killed and one paused", len(won), units)
	}
	db, rdb := testenv.Open(t, st.DSN), testenv.Redis(t, st.RedisDB)
	s := waitRest(t, db, rdb, vid, 10*time.Second)
	checkInvariants(t, s, units, won)
}

// A room's line across two faults, on servers of the test's own: Redis
// killed and restarted from its append-only file (every place, number,
// hold and the count served come back as they were), and MySQL cut for two
// seconds while admitted buyers press (they are answered 503, keep their
// hold, and buy once MySQL is back: never told sold_out).
func TestWaitingRoomAcrossRedisRestartAndMySQLCut(t *testing.T) {
	rd := testenv.StartRedis(t, "--appendonly", "yes", "--appendfsync", "always")
	st := newStack(t, 0)
	cfg, err := mysql.ParseDSN(st.DSN)
	if err != nil {
		t.Fatal(err)
	}
	my := faultproxy.Start(t, cfg.Addr)
	cfg.Addr = my.Addr()
	env := st.env(freeAddr(t), "MYSQL_DSN", cfg.FormatDSN(), "REDIS_ADDR", rd.Addr(), "REDIS_DB", "0")
	in := start(t, env)
	admin, _ := mustLogin(t, in.Base, adminPhone)
	users := loginMany(t, in.Base, 12)
	const units = 6
	begin := time.Now().Add(2 * time.Second).Truncate(time.Second)
	vid := createVoucher(t, in.Base, admin, units, begin, begin.Add(time.Hour), "room", map[string]any{"admit_per_second": 100, "hold_for": 20})
	place := func(u user) reply { return placeOf(t, in.Base+"/vouchers/"+vid+"/room", u.Token) }
	for _, u := range users {
		if r := mustCall(t, "POST", in.Base+"/vouchers/"+vid+"/room", u.Token, nil); r.Status != http.StatusOK {
			t.Fatalf("join: %s", r.Raw)
		}
	}
	time.Sleep(time.Until(begin) + time.Second) // the first six are admitted
	before := map[string]string{}
	var admitted []user
	for _, u := range users {
		r := place(u)
		before[u.ID] = r.Str("state") + " " + r.Str("number") + " " + r.Str("serving")
		if r.Str("state") == room.StateAdmitted {
			admitted = append(admitted, u)
		}
	}
	if len(admitted) != units {
		t.Fatalf("%d admitted a second after the start, want %d: %v", len(admitted), units, before)
	}

	// Redis dies and comes back from its append-only file: the line is
	// as it was.
	rd.Kill()
	rd.Restart(t)
	waitFor(t, 10*time.Second, "the instance to reach Redis again", func() bool {
		r, err := call("GET", in.Base+"/readyz", "", nil)
		return err == nil && r.Status == http.StatusOK
	})
	for _, u := range users {
		r := place(u)
		if got := r.Str("state") + " " + r.Str("number") + " " + r.Str("serving"); got != before[u.ID] {
			t.Errorf("user %s after Redis restarted from its file: %q, before %q", u.ID, got, before[u.ID])
		}
	}

	// MySQL is cut while the admitted buyers press: 503, and the hold
	// stays; healed, they buy.
	var l ledger
	my.Cut()
	for _, u := range admitted[:3] {
		if o := buy(&l, in.Base, u, vid); o.Status != http.StatusServiceUnavailable {
			t.Errorf("a press while MySQL is cut: %d %s, want 503", o.Status, o.Code)
		}
		if r := place(u); r.Str("state") != room.StateAdmitted {
			t.Errorf("after a 503: %s, want still admitted", r.Raw)
		}
	}
	time.Sleep(2 * time.Second)
	my.Heal()
	for _, u := range admitted {
		var o outcome
		for range 20 {
			if o = buy(&l, in.Base, u, vid); o.Status == http.StatusOK || o.Code == "already_ordered" {
				break
			}
			if o.Code == "sold_out" {
				t.Errorf("an admitted buyer told sold_out after MySQL came back")
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
		if o.Status != http.StatusOK {
			t.Errorf("admitted buyer after MySQL came back: %d %s", o.Status, o.Code)
		}
	}
	won := l.wins(t)
	db, rdb := testenv.Open(t, st.DSN), rd.Client(t)
	s := waitRest(t, db, rdb, vid, 10*time.Second)
	checkInvariants(t, s, units, won)
}

// A room voucher whose stock key Redis no longer holds (lost, or
// forgotten a day after its sale) is still shown: the room as its
// settings say, with MySQL's stock, never a 500 for the voucher or for
// the page that lists it.
func TestRoomVoucherWithItsStockKeyGone(t *testing.T) {
	st := newStack(t, 0)
	in := start(t, st.env(freeAddr(t)))
	admin, _ := mustLogin(t, in.Base, adminPhone)
	begin := time.Now().Add(time.Hour).Truncate(time.Second)
	vid := createVoucher(t, in.Base, admin, 5, begin, begin.Add(time.Hour), "room", map[string]any{"admit_per_second": 10, "hold_for": 5})
	id, _ := strconv.ParseInt(vid, 10, 64)
	if err := testenv.Redis(t, st.RedisDB).Del(context.Background(), stock.KeysOf(id).Stock).Err(); err != nil {
		t.Fatal(err)
	}
	r := mustCall(t, "GET", in.Base+"/vouchers/"+vid, "", nil)
	if r.Status != http.StatusOK || !strings.Contains(r.Raw, `"room"`) || !strings.Contains(r.Raw, `"stock":5`) {
		t.Errorf("GET /vouchers/%s with its stock key gone: %d %s; want 200, its room and MySQL's 5 units", vid, r.Status, r.Raw)
	}
	if r := mustCall(t, "GET", in.Base+"/vouchers", "", nil); r.Status != http.StatusOK || !strings.Contains(r.Raw, `"id":"`+vid+`"`) {
		t.Errorf("GET /vouchers with one voucher's stock key gone: %d %s", r.Status, r.Raw)
	}
}
