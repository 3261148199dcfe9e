package stock_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/autopipe"
	"seckill/internal/stock"
	"seckill/internal/testenv"
)

// ConfirmAll leaves Redis as Confirm, hold by hold, leaves it: the same
// holds, claims, buyers and room admissions, for holds of several
// vouchers in several shards, two vouchers in one shard, and units taken
// from other buckets than the buyer's home (a hold there, a claim at
// home). On a three-master cluster, where a script that touched keys of
// two slots would be refused (CROSSSLOT), and on one Redis, where the
// groups of several shards go out in parallel.
//
// It fails if a group mixes slots, if a user's entry is left open, if a
// buyer forgotten meanwhile is not remembered again at home, or is
// remembered in a bucket other than their home, if a room's
// admission is not ended (or one is added), or if a second ConfirmAll
// finds anything open.
func TestConfirmAllAsConfirm(t *testing.T) {
	for _, where := range []string{"one redis", "cluster"} {
		t.Run(where, func(t *testing.T) {
			var rdb redis.UniversalClient
			if where == "cluster" {
				rdb = testenv.StartCluster(t).Client(t)
			} else {
				rdb = testenv.Redis(t, 0)
			}
			s := stock.NewStore(rdb, time.Minute)
			one := scenario(t, rdb, s)
			for _, h := range one.holds {
				if _, err := s.Confirm(context.Background(), h); err != nil {
					t.Fatal(err)
				}
			}
			all := scenario(t, rdb, s)
			closed, err := s.ConfirmAll(context.Background(), all.holds)
			if err != nil {
				t.Fatal(err)
			}
			if closed != all.entries {
				t.Errorf("ConfirmAll closed %d entries, want %d (the holds, and the claims of units from elsewhere)", closed, all.entries)
			}
			want, got := one.state(t, rdb), all.state(t, rdb)
			if !slices.Equal(want, got) {
				t.Errorf("after ConfirmAll:\n%v\nwant, as after Confirm one by one:\n%v", got, want)
			}
			if again, err := s.ConfirmAll(context.Background(), all.holds); err != nil || again != 0 {
				t.Errorf("ConfirmAll again: %d closed, %v; want 0, nil", again, err)
			}
			if after := all.state(t, rdb); !slices.Equal(after, got) {
				t.Errorf("ConfirmAll again changed Redis:\n%v\nwas\n%v", after, got)
			}
		})
	}
}

// confirmScenario is holds taken on fresh vouchers, ready to be closed.
type confirmScenario struct {
	vouchers []int64 // of 1, 1 (the first's shard) and 3 buckets
	buckets  []int
	users    []int64
	holds    []stock.Hold
	entries  int // holds and claims open
}

func scenario(t *testing.T, rdb redis.UniversalClient, s *stock.Store) *confirmScenario {
	t.Helper()
	ctx := context.Background()
	c := &confirmScenario{}
	a := newBucketed(t, rdb, s, 20, 1)
	b := newBucketed(t, rdb, s, 20, 1)
	for stock.ShardOf(b) != stock.ShardOf(a) {
		b = newBucketed(t, rdb, s, 20, 1)
	}
	d := newBucketed(t, rdb, s, 6, 3) // 2 units a bucket
	c.vouchers, c.buckets = []int64{a, b, d}, []int{1, 1, 3}
	// Voucher a has a room's admissions (set by hand: package room's),
	// for two of its buyers and one who does not buy.
	admitted := stock.KeysOf(a).Admitted
	t.Cleanup(func() { rdb.Del(context.Background(), admitted) })
	until := float64(time.Now().Add(time.Hour).UnixMilli())
	rdb.ZAdd(ctx, admitted, redis.Z{Score: until, Member: 1}, redis.Z{Score: until, Member: 2}, redis.Z{Score: until, Member: 99})
	take := func(id int64, n int, user int64) {
		h, res, err := s.Take(ctx, id, n, user)
		if err != nil || res != stock.Taken {
			t.Fatalf("take of voucher %d for user %d: %v %v", id, user, res, err)
		}
		c.holds = append(c.holds, h)
		c.entries++
		if h.From != h.Home {
			c.entries++ // the claim at home
		}
	}
	for u := int64(1); u <= 5; u++ {
		take(a, 1, u)
		take(b, 1, u+100)
	}
	// Bucket 0 of d is home to 5 buyers and holds 2 units: 3 of them take
	// units of buckets 1 and 2.
	for _, u := range usersAt(0, 3, 5) {
		take(d, 3, u)
	}
	c.users = append(usersAt(0, 3, 5), 1, 2, 3, 4, 5, 99, 101, 102, 103, 104, 105)
	elsewhere := 0
	for _, h := range c.holds {
		if h.From != h.Home {
			elsewhere++
		}
	}
	if elsewhere != 3 {
		t.Fatalf("%d units taken from another bucket, want 3", elsewhere)
	}
	// Two buyers forgotten meanwhile (a reload from MySQL, which had not
	// their orders yet): the confirm remembers them again, at home.
	rdb.SRem(ctx, stock.KeysOf(a).Buyers, 3)
	for _, h := range c.holds {
		if h.Voucher == d && h.From != h.Home {
			rdb.SRem(ctx, stock.BucketKeys(d, 3, h.Home).Buyers, h.User)
			break
		}
	}
	// One hold closed already (by the sweeper, say): not counted.
	if _, err := s.Confirm(ctx, c.holds[0]); err != nil {
		t.Fatal(err)
	}
	c.entries--
	return c
}

// state lists, voucher by voucher (by position, not ID), each bucket's
// open holds and claims, which of the scenario's users are its buyers,
// and the room's admissions.
func (c *confirmScenario) state(t *testing.T, rdb redis.UniversalClient) []string {
	t.Helper()
	ctx := context.Background()
	var out []string
	for i, id := range c.vouchers {
		n := c.buckets[i]
		for b := range n {
			k := stock.BucketKeys(id, n, b)
			pre := "voucher " + strconv.Itoa(i) + " bucket " + strconv.Itoa(b) + ": "
			out = append(out, pre+"holds "+strconv.FormatInt(rdb.ZCard(ctx, k.Holds).Val(), 10)+", claims "+strconv.FormatInt(rdb.ZCard(ctx, k.Claims).Val(), 10))
			for _, u := range c.users {
				if rdb.SIsMember(ctx, k.Buyers, u).Val() {
					out = append(out, pre+"buyer "+strconv.FormatInt(u, 10))
				}
			}
			zs, err := rdb.ZRangeWithScores(ctx, k.Admitted, 0, -1).Result()
			if err != nil {
				t.Fatal(err)
			}
			for _, z := range zs {
				ended := "open"
				if z.Score == 0 {
					ended = "ended"
				}
				out = append(out, pre+"admitted "+z.Member.(string)+" "+ended)
			}
		}
	}
	return out
}

// BenchmarkConfirmBatch closes the holds of group-commit batches of 32
// orders of one voucher, on a redis-server of its own through one
// autopipe sender (as the server does): "each" as a sync order did, every
// request woken with its order committed and closing its own hold
// (Confirm, 32 scripts sharing round trips), "all" as the group commit now
// does, one ConfirmAll for the batch, then every request woken. An op is
// one hold closed; redis-µs/op is Redis' CPU (INFO cpu: its system calls
// too) over the timed part only, script-µs/op the time Redis spent running
// the scripts (INFO commandstats).
//
//	SECKILL_INTEGRATION=1 go test -run '^$' -bench ConfirmBatch -benchmem ./internal/stock
func BenchmarkConfirmBatch(b *testing.B) {
	const batch = 32
	srv := testenv.StartRedis(b)
	for _, way := range []string{"each", "all"} {
		b.Run(way, func(b *testing.B) {
			rdb := srv.Client(b)
			p, err := autopipe.Attach(rdb, 1, 128)
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			s := stock.NewStore(rdb, time.Minute)
			ctx := context.Background()
			id := newBucketed(b, rdb, s, 1, 1)
			k := stock.KeysOf(id)
			// The requests: each waits for its turn, closes its hold if
			// told to (each), and says it is done.
			var wg sync.WaitGroup
			work := make([]chan *stock.Hold, batch)
			for i := range work {
				work[i] = make(chan *stock.Hold, 1)
				go func() {
					for h := range work[i] {
						if h != nil {
							if _, err := s.Confirm(ctx, *h); err != nil {
								b.Error(err)
							}
						}
						wg.Done()
					}
				}()
			}
			defer func() {
				for _, c := range work {
					close(c)
				}
			}()
			hs := make([]stock.Hold, batch)
			zs := make([]redis.Z, batch)
			var user int64
			var cpu float64
			if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for done := 0; done < b.N; done += batch {
				b.StopTimer()
				for i := range hs {
					user++
					hs[i] = stock.Hold{Voucher: id, User: user, Buckets: 1}
					zs[i] = redis.Z{Score: float64(time.Now().Add(time.Minute).UnixMilli()), Member: user}
				}
				if err := rdb.ZAdd(ctx, k.Holds, zs...).Err(); err != nil {
					b.Fatal(err)
				}
				cpu0 := redisCPU(b, rdb)
				b.StartTimer()
				wg.Add(batch)
				if way == "each" {
					for i := range work {
						work[i] <- &hs[i]
					}
				} else {
					if n, err := s.ConfirmAll(ctx, hs); err != nil || n != batch {
						b.Fatalf("ConfirmAll: %d %v", n, err)
					}
					for i := range work {
						work[i] <- nil
					}
				}
				wg.Wait()
				b.StopTimer()
				cpu += redisCPU(b, rdb) - cpu0
				b.StartTimer()
			}
			b.StopTimer()
			if n := rdb.ZCard(ctx, k.Holds).Val(); n != 0 {
				b.Fatalf("%d holds left open", n)
			}
			b.ReportMetric(cpu*1e6/float64(b.N), "redis-µs/op")
			b.ReportMetric(scriptTime(b, rdb)/float64(b.N), "script-µs/op")
		})
	}
}

// redisCPU is the seconds of CPU the server has used (INFO cpu).
func redisCPU(b *testing.B, rdb *redis.Client) float64 {
	info, err := rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for line := range strings.SplitSeq(info, "\r\n") {
		name, value, ok := strings.Cut(line, ":")
		if ok && (name == "used_cpu_sys" || name == "used_cpu_user") {
			f, err := strconv.ParseFloat(value, 64)
			if err != nil {
				b.Fatal(err)
			}
			total += f
		}
	}
	return total
}

// scriptTime is the µs Redis spent in EVAL and EVALSHA since the last
// CONFIG RESETSTAT (INFO commandstats).
func scriptTime(b *testing.B, rdb *redis.Client) float64 {
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for line := range strings.SplitSeq(info, "\r\n") {
		name, fields, ok := strings.Cut(line, ":")
		if !ok || (name != "cmdstat_evalsha" && name != "cmdstat_eval") {
			continue
		}
		for field := range strings.SplitSeq(fields, ",") {
			if v, ok := strings.CutPrefix(field, "usec="); ok {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					b.Fatal(err)
				}
				total += f
			}
		}
	}
	return total
}

// TestConfirmAllManyHolds closes more holds in one call than Lua's unpack
// can put on its stack at once (8,000): confirmall.lua sends them to ZREM
// and SADD in slices of 1,000. Without the slices the script fails with
// "too many results to unpack". A second voucher's holds follow in the
// same call (the script must find their place in ARGV after the slices),
// and the first has a waiting room whose admissions end. (A group
// commit's batch is 100 orders at most today; the slices are for a
// larger GROUP_COMMIT.)
func TestConfirmAllManyHolds(t *testing.T) {
	const n = 8200 // eight whole slices and a part
	rdb := testenv.Redis(t, 0)
	s := stock.NewStore(rdb, time.Minute)
	ctx := context.Background()
	id := newBucketed(t, rdb, s, n, 1)
	other := newBucketed(t, rdb, s, 5, 1)
	for stock.ShardOf(other) != stock.ShardOf(id) {
		other = newBucketed(t, rdb, s, 5, 1)
	}
	admitted := stock.KeysOf(id).Admitted
	t.Cleanup(func() { rdb.Del(context.Background(), admitted) })
	until := float64(time.Now().Add(time.Hour).UnixMilli())
	rdb.ZAdd(ctx, admitted, redis.Z{Score: until, Member: 1}, redis.Z{Score: until, Member: n}, redis.Z{Score: until, Member: n + 1})
	holds := make([]stock.Hold, n, n+3)
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := w; i < n; i += 16 {
				h, res, err := s.Take(ctx, id, 1, int64(i+1))
				if err != nil || res != stock.Taken {
					t.Errorf("take for user %d: %v %v", i+1, res, err)
					return
				}
				holds[i] = h
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	for u := int64(1); u <= 3; u++ {
		h, res, err := s.Take(ctx, other, 1, u)
		if err != nil || res != stock.Taken {
			t.Fatalf("take of the other voucher for user %d: %v %v", u, res, err)
		}
		holds = append(holds, h)
	}
	k, ko := stock.KeysOf(id), stock.KeysOf(other)
	// Forget every buyer: the confirm must remember them all again.
	if err := rdb.Del(ctx, k.Buyers, ko.Buyers).Err(); err != nil {
		t.Fatal(err)
	}
	closed, err := s.ConfirmAll(ctx, holds)
	if err != nil {
		t.Fatalf("ConfirmAll of %d holds: %v", len(holds), err)
	}
	if closed != len(holds) {
		t.Errorf("ConfirmAll closed %d holds, want %d", closed, len(holds))
	}
	for _, c := range []struct {
		keys   stock.Keys
		buyers int64
	}{{k, n}, {ko, 3}} {
		if open := rdb.ZCard(ctx, c.keys.Holds).Val(); open != 0 {
			t.Errorf("%s: %d holds still open", c.keys.Holds, open)
		}
		if buyers := rdb.SCard(ctx, c.keys.Buyers).Val(); buyers != c.buyers {
			t.Errorf("%s: %d buyers remembered, want %d", c.keys.Buyers, buyers, c.buyers)
		}
	}
	// The admissions of buyers 1 and n end (score 0); n+1 did not buy.
	for member, want := range map[string]float64{"1": 0, strconv.Itoa(n): 0, strconv.Itoa(n + 1): until} {
		if got := rdb.ZScore(ctx, admitted, member).Val(); got != want {
			t.Errorf("admission of user %s: score %v, want %v", member, got, want)
		}
	}
}

// TestConfirmAllCountsWhatItLeaves: on a cluster with one master silent
// (frozen, SIGSTOP), ConfirmAll's calls to that master's shards fail and
// the others' succeed; its error counts the holds whose close was not
// acknowledged, each hold whose unit, or whose claim at home, lives on
// the silent master, once, and every other hold is closed.
func TestConfirmAllCountsWhatItLeaves(t *testing.T) {
	cluster := testenv.StartCluster(t)
	// A client whose contexts bound its reads (without it go-redis waits
	// its ReadTimeout, 3 s, for the silent master): the freeze must end
	// well within the cluster's NodeTimeout, before a replica would take
	// the master's place.
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs(), MaxRetries: -1, DialTimeout: 2 * time.Second, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	s := stock.NewStore(rdb, time.Minute)
	ctx := context.Background()
	master := func(k stock.Keys) string { return cluster.MasterOf(t, k.Holds).Addr() }

	// Vouchers of one bucket until two masters have some, and one of
	// three buckets whose buyers take units of other buckets (a hold and
	// a claim, perhaps on two masters).
	var holds []stock.Hold
	take := func(id int64, n int, user int64) {
		h, res, err := s.Take(ctx, id, n, user)
		if err != nil || res != stock.Taken {
			t.Fatalf("take of voucher %d for user %d: %v %v", id, user, res, err)
		}
		holds = append(holds, h)
	}
	masters := map[string]bool{}
	for len(masters) < 2 {
		id := newBucketed(t, rdb, s, 5, 1)
		masters[master(stock.KeysOf(id))] = true
		for u := int64(1); u <= 3; u++ {
			take(id, 1, u)
		}
	}
	d := newBucketed(t, rdb, s, 6, 3) // 2 units a bucket
	for _, u := range usersAt(0, 3, 5) {
		take(d, 3, u)
	}
	silent := master(stock.KeysOf(holds[0].Voucher))
	want := 0
	var left, closed []stock.Hold
	for _, h := range holds {
		if master(stock.BucketKeys(h.Voucher, h.Buckets, h.From)) == silent || master(stock.BucketKeys(h.Voucher, h.Buckets, h.Home)) == silent {
			want++
			left = append(left, h)
		} else {
			closed = append(closed, h)
		}
	}
	if len(closed) == 0 {
		t.Fatal("every hold lives on one master: the test would show nothing")
	}

	var node *testenv.RedisServer
	for _, m := range cluster.Masters(t) {
		if m.Addr() == silent {
			node = m
		}
	}
	if node == nil {
		t.Fatalf("no master at %s", silent)
	}
	node.Freeze(t)
	thawed := false
	t.Cleanup(func() {
		if !thawed {
			node.Thaw(t)
		}
	})
	start := time.Now()
	cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err := s.ConfirmAll(cctx, holds)
	cancel()
	took := time.Since(start)
	node.Thaw(t)
	thawed = true
	if took > testenv.NodeTimeout/2 {
		t.Fatalf("ConfirmAll took %v with a master silent: its context did not bound it, and the cluster may have failed over", took)
	}

	ue, ok := errors.AsType[*stock.UnconfirmedError](err)
	if !ok {
		t.Fatalf("ConfirmAll with a master silent: %v, want an *UnconfirmedError", err)
	}
	if ue.Holds != want {
		t.Errorf("ConfirmAll counts %d holds left open, want %d of %d", ue.Holds, want, len(holds))
	}
	isOpen := func(h stock.Hold) bool {
		k := stock.BucketKeys(h.Voucher, h.Buckets, h.From)
		_, err := rdb.ZScore(ctx, k.Holds, strconv.FormatInt(h.User, 10)).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatalf("hold of user %d: %v", h.User, err)
		}
		return err == nil
	}
	for _, h := range closed {
		if isOpen(h) {
			t.Errorf("voucher %d user %d: hold open, though no entry of it is on the silent master", h.Voucher, h.User)
		}
	}
	// The holds counted (left) are not looked at: the silent master had
	// the script in its socket and ran it when thawed, as a master whose
	// reply alone was lost would have. The count is of what was not
	// acknowledged, which is all the caller can know.
	t.Logf("%d holds of %d counted as left open", len(left), len(holds))
}
