package main

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	stockpkg "seckill/internal/stock"
	"seckill/internal/testenv"
)

// A script whose reply comes too late must not run twice. The script here
// takes 400 ms, the client waits 200 ms for a reply: the script runs to its
// end while the client gives up on it. go-redis' cluster client, left to
// itself, sends it again on a timeout (up to MaxRedirects times, whatever
// MaxRetries says), so it runs more than once: the first case, the proof
// that the test can fail. The service's client (newClusterClient) answers
// the timeout as an error, and the script runs once.
func TestClusterClientSendsOnce(t *testing.T) {
	c := testenv.StartCluster(t)
	ctx := context.Background()
	slow := redis.NewScript(`
local t = redis.call('TIME')
local start = t[1] * 1000 + math.floor(t[2] / 1000)
repeat
  t = redis.call('TIME')
until t[1] * 1000 + math.floor(t[2] / 1000) - start >= 400
return redis.call('INCR', KEYS[1])`)
	opt := &redis.UniversalOptions{Addrs: c.Addrs(), MaxRetries: -1, ReadTimeout: 200 * time.Millisecond}
	for _, tc := range []struct {
		name string
		rdb  *redis.ClusterClient
		once bool
	}{
		{"go-redis alone", redis.NewClusterClient(opt.Cluster()), false},
		{"the service's client", newClusterClient(opt), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Cleanup(func() { tc.rdb.Close() })
			key := testenv.Name("{sent-once}:")
			err := slow.Run(ctx, tc.rdb, []string{key}).Err()
			if err == nil {
				t.Fatal("a 400 ms script answered within a 200 ms read timeout")
			}
			master := c.MasterOf(t, key).Client(t)
			time.Sleep(2 * time.Second) // every run that was sent is over
			runs, _ := master.Get(ctx, key).Int()
			switch {
			case tc.once && runs != 1:
				t.Fatalf("the script ran %d times, want once (err %v)", runs, err)
			case !tc.once && runs < 2:
				t.Fatalf("the script ran %d times: go-redis no longer sends it again, and this test proves nothing", runs)
			}
			t.Logf("ran %d times; the caller got: %v", runs, err)
		})
	}
}

// Three instances share one MySQL and a Redis Cluster of three masters;
// hundreds of users fire at once, several tries each, at two vouchers
// whose keys live on different masters. Every script keeps to its
// voucher's slot (in async mode with its shard's stream), so the sale runs
// as on one Redis: the same invariants, in both modes.
func TestSaleOnRedisCluster(t *testing.T) {
	c := testenv.StartCluster(t)
	rdb := c.Client(t)
	for _, mode := range []string{"sync", "async"} {
		t.Run(mode, func(t *testing.T) {
			st := newStack(t, 0)
			insts := onCluster(t, st, c, mode, 3)
			admin, _ := mustLogin(t, insts[0].Base, adminPhone)
			const stock = 100
			// Vouchers go to shards by ID, and shard k's slots are the
			// k-th sixteenth of them: six shards apart is more than the
			// third of the slots a master of this cluster serves, so the
			// first and the seventh voucher live on different masters.
			var vids []string
			for i := range 7 {
				vid := openVoucher(t, insts[0].Base, admin, stock)
				if i == 0 || i == 6 {
					vids = append(vids, vid)
				}
			}
			users := loginMany(t, insts[2].Base, 300)

			ledgers := make([]ledger, len(vids))
			var wg sync.WaitGroup
			for i, vid := range vids {
				wg.Go(func() { rush(&ledgers[i], insts, users, vid, 2) })
			}
			wg.Wait()

			db := testenv.Open(t, st.DSN)
			masters := map[string]bool{}
			for i, vid := range vids {
				l := &ledgers[i]
				onlyExpected(t, l, "sold_out", "already_ordered")
				won := l.wins(t)
				if len(won) != stock {
					t.Errorf("voucher %s: %d users won, want %d", vid, len(won), stock)
				}
				if mode == "async" {
					waitWritten(t, db, rdb, vid, won, 15*time.Second)
				}
				s := waitRest(t, db, rdb, vid, 5*time.Second)
				checkInvariants(t, s, stock, won)
				if s.Stock != 0 {
					t.Errorf("voucher %s: %d left, want 0", vid, s.Stock)
				}
				masters[c.MasterOf(t, voucherKey(vid, "stock")).Addr()] = true
			}
			if len(masters) != 2 {
				t.Errorf("the two vouchers' keys are on %d masters, want 2", len(masters))
			}
		})
	}
	// A voucher behind a waiting room: the line's keys and the stock's
	// share the voucher's slot, so that join.lua, admit.lua and the stock
	// scripts run on a cluster as on one Redis.
	for _, mode := range []string{"sync", "async"} {
		t.Run(mode+"/room", func(t *testing.T) {
			st := newStack(t, 0)
			insts := onCluster(t, st, c, mode, 2)
			admin, _ := mustLogin(t, insts[0].Base, adminPhone)
			users := loginMany(t, insts[1].Base, 20)
			const units = 10
			begin := time.Now().Add(2 * time.Second).Truncate(time.Second)
			vid := createVoucher(t, insts[0].Base, admin, units, begin, begin.Add(time.Hour), "room", map[string]any{"admit_per_second": 100, "hold_for": 30})
			for i, u := range users {
				if r := mustCall(t, "POST", insts[i%2].Base+"/vouchers/"+vid+"/room", u.Token, nil); r.Status != 200 {
					t.Fatalf("join: %s", r.Raw)
				}
			}
			time.Sleep(time.Until(begin))
			var l ledger
			var wg sync.WaitGroup
			for i, u := range users {
				wg.Go(func() {
					for range 40 {
						r, err := call("GET", insts[i%2].Base+"/vouchers/"+vid+"/room", u.Token, nil)
						if err == nil && r.Str("state") == "admitted" {
							if o := buy(&l, insts[(i+1)%2].Base, u, vid); o.Status == 200 || o.Code == "sold_out" {
								return
							}
						}
						if r.Str("state") == "sold_out" {
							return
						}
						time.Sleep(150 * time.Millisecond)
					}
				})
			}
			wg.Wait()
			if n := l.count(409, "sold_out"); n != 0 {
				t.Errorf("%d admitted buyers were told sold_out", n)
			}
			won := l.wins(t)
			if len(won) != units {
				t.Errorf("%d of %d units sold through the room on a cluster", len(won), units)
			}
			db := testenv.Open(t, st.DSN)
			if mode == "async" {
				waitWritten(t, db, rdb, vid, won, 15*time.Second)
			}
			checkInvariants(t, waitRest(t, db, rdb, vid, 5*time.Second), units, won)
		})
	}
	// A hot voucher split into three buckets, one on each master, sold by
	// three instances: its users' homes spread over the buckets, and the
	// last units sell from whichever bucket still has them. In async mode
	// each order goes to the stream of its unit's bucket, and a buyer whose
	// unit came from another bucket than their home is claimed at home
	// first.
	for _, mode := range []string{"sync", "async"} {
		t.Run(mode+"/buckets", func(t *testing.T) {
			st := newStack(t, 0)
			insts := onCluster(t, st, c, mode, 3)
			admin, _ := mustLogin(t, insts[0].Base, adminPhone)
			const stock = 100
			vid := createVoucher(t, insts[0].Base, admin, stock, time.Now().Add(-time.Minute), time.Now().Add(time.Hour), "buckets", 3)
			if got := mustCall(t, "GET", insts[1].Base+"/vouchers/"+vid, "", nil); got.Body["buckets"] != 3.0 || got.Body["stock"] != float64(stock) {
				t.Fatalf("GET the voucher: %s", got.Raw)
			}
			id, _ := strconv.ParseInt(vid, 10, 64)
			masters := map[string]bool{}
			for b := range 3 {
				masters[c.MasterOf(t, stockpkg.BucketKeys(id, 3, b).Stock).Addr()] = true
			}
			if len(masters) != 3 {
				t.Errorf("the three buckets are on %d masters, want 3", len(masters))
			}
			// Homes out of balance: bucket 0 is home to most buyers, so
			// that once it is empty they take the last units of the others
			// (16 of them, if the 25 buyers at home in each of the others
			// take 25 of its 33), claimed at home.
			var users []user
			homes := map[int]int{}
			for _, u := range loginMany(t, insts[2].Base, 400) {
				uid, _ := strconv.ParseInt(u.ID, 10, 64)
				if h := stockpkg.Home(uid, 3); (h == 0 && homes[h] < 120) || homes[h] < 25 {
					homes[h]++
					users = append(users, u)
				}
			}
			var l ledger
			rush(&l, insts, users, vid, 2)
			onlyExpected(t, &l, "sold_out", "already_ordered")
			won := l.wins(t)
			if len(won) != stock {
				t.Errorf("%d users won, want %d", len(won), stock)
			}
			db := testenv.Open(t, st.DSN)
			if mode == "async" {
				waitWritten(t, db, rdb, vid, won, 15*time.Second)
			}
			// Each order's row says which bucket its unit came from (where
			// a cancel gives it back): all three, and some not the
			// buyer's home.
			var rows []struct {
				UserID int64
				Bucket int
			}
			db.Raw("SELECT user_id, bucket FROM voucher_orders WHERE voucher_id = ?", id).Scan(&rows)
			from, away := map[int]int{}, 0
			for _, r := range rows {
				from[r.Bucket]++
				if r.Bucket != stockpkg.Home(r.UserID, 3) {
					away++
				}
			}
			t.Logf("buyers by home %v; orders by their unit's bucket %v, %d of them not from the buyer's home", homes, from, away)
			if len(from) != 3 || away == 0 {
				t.Errorf("units sold from buckets %v, %d away from home; want all three, and some away", from, away)
			}
			s := waitRest(t, db, rdb, vid, 5*time.Second)
			checkInvariants(t, s, stock, won)
			if s.Stock != 0 || s.RedisStock != 0 {
				t.Errorf("left: MySQL %d, Redis %d; want 0 and 0", s.Stock, s.RedisStock)
			}
		})
	}
}

// onCluster starts n instances of st in mode on the Redis Cluster c.
func onCluster(t *testing.T, st stack, c *testenv.Cluster, mode string, n int) []*instance {
	t.Helper()
	var insts []*instance
	for range n {
		env := st.env(freeAddr(t), "REDIS_ADDRS", strings.Join(c.Addrs(), ","), "SECKILL_MODE", mode)
		delete(env, "REDIS_ADDR")
		insts = append(insts, start(t, env))
	}
	return insts
}
