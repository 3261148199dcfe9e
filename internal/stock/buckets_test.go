package stock_test

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/stock"
	"seckill/internal/testenv"
)

// newBucketed sets up a voucher of units split into n buckets on rdb, and
// removes its keys afterwards.
func newBucketed(t testing.TB, rdb redis.UniversalClient, s *stock.Store, units int64, n int) int64 {
	t.Helper()
	id := testenv.ID()
	if err := s.Init(context.Background(), id, units, n); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		for b := range n {
			k := stock.BucketKeys(id, n, b)
			for _, key := range []string{k.Stock, k.Buyers, k.Holds, k.Claims} {
				rdb.Del(ctx, key) // one by one: a cluster refuses keys of several slots
			}
		}
		rdb.SRem(ctx, "seckill:vouchers", id)
	})
	return id
}

func leftOf(t testing.TB, s *stock.Store, id int64, n int) int64 {
	t.Helper()
	left, ok, err := s.Left(context.Background(), id, n)
	if err != nil || !ok {
		t.Fatalf("left: %d %v %v", left, ok, err)
	}
	return left
}

// usersAt returns count user IDs whose home bucket of n is b.
func usersAt(b, n, count int) []int64 {
	var users []int64
	for u := int64(1); len(users) < count; u++ {
		if stock.Home(u, n) == b {
			users = append(users, u)
		}
	}
	return users
}

// Init splits the stock evenly; Home spreads users evenly; bucket keys of
// one bucket share a slot, and a voucher of one bucket keeps its keys.
func TestBucketLayout(t *testing.T) {
	counts := make([]int, 5)
	for u := range int64(50_000) {
		counts[stock.Home(u+1, 5)]++
	}
	for b, c := range counts {
		if math.Abs(float64(c)-10_000) > 300 {
			t.Errorf("bucket %d is home to %d of 50,000 users, want about 10,000", b, c)
		}
	}
	if stock.BucketKeys(7, 1, 0) != stock.KeysOf(7) {
		t.Error("a voucher of one bucket moved its keys")
	}
	tag := func(key string) string { return key[strings.Index(key, "{")+1 : strings.Index(key, "}")] }
	// n masters, the slots split evenly: one bucket per master for these
	// n (buckets.go); for the others, some buckets share a master.
	even := map[int]bool{2: true, 3: true, 4: true, 5: true, 6: true, 7: true, 8: true, 9: true, 11: true, 16: true}
	for n := 2; n <= stock.MaxBuckets; n++ {
		shards := map[int]bool{}
		for b := range n {
			k := stock.BucketKeys(7, n, b)
			slot := stock.Slot(tag(k.Stock))
			if tag(k.Buyers) != tag(k.Stock) || tag(k.Holds) != tag(k.Stock) || tag(k.Claims) != tag(k.Stock) || tag(k.Returned) != tag(k.Stock) {
				t.Fatalf("bucket %d of %d: keys in different slots: %+v", b, n, k)
			}
			// In a shard's slot, where async mode's stream of that shard is.
			shard := stock.BucketShard(7, n, b)
			if tag(stock.ShardKey(shard, "orders")) != tag(k.Stock) {
				t.Fatalf("bucket %d of %d: not in the slot of shard %d", b, n, shard)
			}
			shards[shard] = true
			if lo, hi := b*16384/n, (b+1)*16384/n; even[n] && (slot < lo || slot >= hi) {
				t.Errorf("bucket %d of %d in slot %d, outside [%d, %d)", b, n, slot, lo, hi)
			}
		}
		if len(shards) != n {
			t.Errorf("%d buckets in %d shards", n, len(shards))
		}
	}

	rdb := testenv.Redis(t, 0)
	s := stock.NewStore(rdb, time.Minute)
	id := newBucketed(t, rdb, s, 10, 4)
	for b, want := range []string{"3", "3", "2", "2"} {
		if got := rdb.Get(context.Background(), stock.BucketKeys(id, 4, b).Stock).Val(); got != want {
			t.Errorf("bucket %d holds %s units, want %s", b, got, want)
		}
	}
}

// 265 users rush 60 units in 4 buckets (15 each) at once, each twice,
// 250 of them at home in bucket 0, so that most units sell to users whose
// home is another bucket:
// exactly 60 units are taken, each by a different user, nothing is left in
// any bucket, and every taker is remembered as a buyer in their home
// bucket only.
func TestBucketsNeverOversell(t *testing.T) {
	rdb := testenv.Redis(t, 0)
	s := stock.NewStore(rdb, time.Minute)
	const n = 4
	id := newBucketed(t, rdb, s, 60, n)
	var taken atomic.Int64
	var fromElsewhere atomic.Int64
	var buyers sync.Map
	gate := make(chan struct{})
	var wg sync.WaitGroup
	users := usersAt(0, n, 250)
	for b := 1; b < n; b++ {
		users = append(users, usersAt(b, n, 5)...)
	}
	for _, user := range users {
		wg.Go(func() {
			<-gate
			for range 2 {
				h, res, err := s.Take(context.Background(), id, n, user)
				if err != nil {
					t.Error(err)
					return
				}
				if res != stock.Taken {
					continue
				}
				taken.Add(1)
				if h.From != h.Home {
					fromElsewhere.Add(1)
				}
				if _, dup := buyers.LoadOrStore(user, true); dup {
					t.Errorf("user %d took two units", user)
				}
				if _, err := s.Confirm(context.Background(), h); err != nil {
					t.Error(err)
				}
			}
		})
	}
	close(gate)
	wg.Wait()
	if taken.Load() != 60 || leftOf(t, s, id, n) != 0 {
		t.Fatalf("taken %d, left %d; want 60 and 0", taken.Load(), leftOf(t, s, id, n))
	}
	// At most 15 units sell at home in bucket 0, and 15 to the users of
	// the other buckets.
	if fromElsewhere.Load() < 30 {
		t.Errorf("%d units came from a bucket other than their buyer's home, want at least 30", fromElsewhere.Load())
	}
	t.Logf("%d of 60 units came from a bucket other than the buyer's home", fromElsewhere.Load())
	ctx := context.Background()
	for b := range n {
		k := stock.BucketKeys(id, n, b)
		if open := rdb.ZCard(ctx, k.Holds).Val() + rdb.ZCard(ctx, k.Claims).Val(); open != 0 {
			t.Errorf("bucket %d: %d holds or claims left open", b, open)
		}
		members := rdb.SMembers(ctx, k.Buyers).Val()
		for _, m := range members {
			u, _ := strconv.ParseInt(m, 10, 64)
			if stock.Home(u, n) != b {
				t.Errorf("user %d remembered in bucket %d, home %d", u, b, stock.Home(u, n))
			}
			if _, ok := buyers.Load(u); !ok {
				t.Errorf("user %d remembered as a buyer without a unit", u)
			}
		}
	}
}

// A buyer whose home bucket is empty clicks again and again while another
// user buys the last unit of another bucket: the buyer is told "already
// bought" at home and never touches the other bucket. (When take.lua
// checked the stock before the buyer, each click took that unit, lost its
// claim at home and gave the unit back, and meanwhile the other user was
// told "sold out" about one time in three.)
func TestBucketsRepeatBuyerLeavesOthersAlone(t *testing.T) {
	rdb := testenv.Redis(t, 0)
	s := stock.NewStore(rdb, time.Minute)
	ctx := context.Background()
	const n = 2
	id := newBucketed(t, rdb, s, 2, n) // a unit in each bucket
	buyer := usersAt(0, n, 1)[0]
	h, res, err := s.Take(ctx, id, n, buyer)
	if err != nil || res != stock.Taken {
		t.Fatalf("first take: %v %v", res, err)
	}
	if _, err := s.Confirm(ctx, h); err != nil {
		t.Fatal(err)
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, res, err := s.Take(ctx, id, n, buyer); err != nil || res != stock.AlreadyBought {
				t.Errorf("the buyer clicking again: %v %v, want already bought", res, err)
				return
			}
		}
	})
	for _, u := range usersAt(1, n, 300) {
		h, res, err := s.Take(ctx, id, n, u)
		if err != nil || res != stock.Taken {
			t.Errorf("user %d, a unit left in their home bucket: %v %v, want taken", u, res, err)
			break
		}
		if _, err := s.GiveBack(ctx, h, true); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
}

// A user whose home bucket is empty looks at the other buckets in one
// pipeline and asks for a unit only where there is one: with 8 buckets and
// the last unit in the last bucket asked, a take is 3 scripts (home, the
// unit, the claim), not one per bucket.
func TestBucketsAskOnlyWhereStockIs(t *testing.T) {
	srv := testenv.StartRedis(t)
	rdb := srv.Client(t)
	s := stock.NewStore(rdb, time.Minute)
	ctx := context.Background()
	const n = 8
	id := newBucketed(t, rdb, s, 1, n) // bucket 0 holds the one unit
	user := usersAt(1, n, 1)[0]        // home 1: bucket 0 is asked last
	// A take that finds its home empty, to load the scripts.
	if _, res, err := s.Take(ctx, id, n, usersAt(2, n, 1)[0]); err != nil || res != stock.Taken {
		t.Fatalf("warm-up: %v %v", res, err)
	}
	if err := s.Init(ctx, id, 1, n); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if _, res, err := s.Take(ctx, id, n, user); err != nil || res != stock.Taken {
		t.Fatalf("take: %v %v", res, err)
	}
	if scripts := testenv.ScriptsIn(rdb.Info(ctx, "commandstats").Val()); scripts != 3 {
		t.Errorf("a take from the last bucket ran %d scripts, want 3", scripts)
	}
}

// A unit taken from another bucket is confirmed on a Redis that has never
// run the confirm script (a fresh server, a restart, a failed-over
// replica): its hold and the claim at home are both closed.
func TestBucketsConfirmOnAFreshServer(t *testing.T) {
	rdb := testenv.StartRedis(t).Client(t)
	s := stock.NewStore(rdb, time.Minute)
	ctx := context.Background()
	const n = 2
	id := newBucketed(t, rdb, s, 1, n) // the unit is in bucket 0
	h, res, err := s.Take(ctx, id, n, usersAt(1, n, 1)[0])
	if err != nil || res != stock.Taken || h.From == h.Home {
		t.Fatalf("take from the other bucket: %+v %v %v", h, res, err)
	}
	if open, err := s.Confirm(ctx, h); err != nil || !open {
		t.Fatalf("confirm: %v %v", open, err)
	}
	for b := range n {
		k := stock.BucketKeys(id, n, b)
		if c := rdb.ZCard(ctx, k.Holds).Val() + rdb.ZCard(ctx, k.Claims).Val(); c != 0 {
			t.Errorf("bucket %d: %d holds or claims left open", b, c)
		}
	}
}

// The last units sell wherever they lie: users whose home bucket is empty
// take the units of the others, and only then is the voucher sold out.
func TestBucketsStrandNothing(t *testing.T) {
	rdb := testenv.Redis(t, 0)
	s := stock.NewStore(rdb, time.Minute)
	const n = 8
	id := newBucketed(t, rdb, s, 5, n) // buckets 0-4 hold a unit each
	ctx := context.Background()
	users := usersAt(7, n, 6) // home: bucket 7, which is empty
	for i, u := range users {
		h, res, err := s.Take(ctx, id, n, u)
		if i == 5 {
			if err != nil || res != stock.SoldOut {
				t.Fatalf("sixth user: %v %v, want SoldOut", res, err)
			}
			break
		}
		if err != nil || res != stock.Taken || h.Home != 7 || h.From == 7 {
			t.Fatalf("user %d: %v %v from %d home %d", u, res, err, h.From, h.Home)
		}
		if _, err := s.Confirm(ctx, h); err != nil {
			t.Fatal(err)
		}
	}
	if left := leftOf(t, s, id, n); left != 0 {
		t.Fatalf("left %d, want 0", left)
	}
	// A user who bought from elsewhere is remembered at home: a second try
	// is AlreadyBought once a unit is there again.
	rdb.Incr(ctx, stock.BucketKeys(id, n, 7).Stock)
	if _, res, _ := s.Take(ctx, id, n, users[0]); res != stock.AlreadyBought {
		t.Fatalf("buyer again: %v, want AlreadyBought", res)
	}
}

// One user's many concurrent requests, their home empty: exactly one
// takes a unit, wherever the units come from, and no unit is lost.
func TestBucketsOneUserOnce(t *testing.T) {
	rdb := testenv.Redis(t, 0)
	s := stock.NewStore(rdb, time.Minute)
	const n = 4
	for round := range 20 {
		id := newBucketed(t, rdb, s, 3, n) // buckets 0-2 hold a unit, 3 none
		user := usersAt(3, n, round+1)[round]
		var taken atomic.Int64
		var holds sync.Map
		gate := make(chan struct{})
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				<-gate
				h, res, err := s.Take(context.Background(), id, n, user)
				if err != nil {
					t.Error(err)
				}
				if res == stock.Taken {
					taken.Add(1)
					holds.Store(h.From, h)
				}
			})
		}
		close(gate)
		wg.Wait()
		if taken.Load() != 1 {
			t.Fatalf("round %d: %d requests of one user took a unit", round, taken.Load())
		}
		if left := leftOf(t, s, id, n); left != 2 {
			t.Fatalf("round %d: left %d, want 2 (no unit lost to a refused request)", round, left)
		}
		// Giving it back restores everything: the unit and the user's
		// right to buy.
		holds.Range(func(_, h any) bool {
			if back, err := s.GiveBack(context.Background(), h.(stock.Hold), true); err != nil || !back {
				t.Fatalf("give back: %v %v", back, err)
			}
			return true
		})
		if left := leftOf(t, s, id, n); left != 3 {
			t.Fatalf("round %d: left %d after giving back, want 3", round, left)
		}
		if _, res, _ := s.Take(context.Background(), id, n, user); res != stock.Taken {
			t.Fatalf("round %d: take after giving back: %v", round, res)
		}
	}
}

// A request that dies after taking a unit elsewhere leaves two expired
// entries: the unit's hold and the claim at home. Settling them without an
// order gives the unit back and forgets the buyer; with an order, keeps
// both.
func TestBucketsSettleLapses(t *testing.T) {
	rdb := testenv.Redis(t, 0)
	s := stock.NewStore(rdb, 200*time.Millisecond)
	ctx := context.Background()
	const n = 2
	id := newBucketed(t, rdb, s, 2, n) // a unit in each
	home1 := usersAt(1, n, 3)
	// Empty bucket 1 with one user, then two more of home 1 take from 0.
	for _, u := range home1[:2] {
		if _, res, err := s.Take(ctx, id, n, u); err != nil || res != stock.Taken {
			t.Fatalf("take: %v %v", res, err)
		}
	}
	time.Sleep(300 * time.Millisecond)
	lapses, err := s.Expired(ctx, id, n, 10)
	if err != nil {
		t.Fatal(err)
	}
	want := map[stock.Lapse]bool{
		{User: home1[0], Bucket: 1}:              true,
		{User: home1[1], Bucket: 0}:              true,
		{User: home1[1], Bucket: 1, Claim: true}: true,
	}
	if len(lapses) != len(want) {
		t.Fatalf("expired: %+v, want %v", lapses, want)
	}
	for _, l := range lapses {
		if !want[l] {
			t.Fatalf("expired: %+v, want %v", lapses, want)
		}
		// home1[0] ordered; home1[1] did not.
		var order int64
		if l.User == home1[0] {
			order = 1 // any ID: the order exists
		}
		back, err := s.Settle(ctx, id, n, l, order)
		if err != nil || back != (l.User == home1[1] && !l.Claim) {
			t.Fatalf("settle %+v: back %v %v", l, back, err)
		}
	}
	if left := leftOf(t, s, id, n); left != 1 {
		t.Fatalf("left %d, want 1", left)
	}
	if _, res, _ := s.Take(ctx, id, n, home1[0]); res != stock.AlreadyBought && res != stock.SoldOut {
		t.Fatalf("the user with an order: %v", res)
	}
	if _, res, _ := s.Take(ctx, id, n, home1[1]); res != stock.Taken {
		t.Fatalf("the user whose request died: %v, want Taken (forgotten)", res)
	}
}

// Reconcile compares the sum over the buckets with the database's figure,
// and corrects it only when no bucket moved.
func TestBucketsReconcile(t *testing.T) {
	rdb := testenv.Redis(t, 0)
	s := stock.NewStore(rdb, time.Minute)
	ctx := context.Background()
	const n = 3
	id := newBucketed(t, rdb, s, 9, n) // 3, 3, 3
	truth := func(v int64) func(context.Context) (int64, error) {
		return func(context.Context) (int64, error) { return v, nil }
	}
	if fixed, err := s.Reconcile(ctx, id, n, truth(9)); err != nil || fixed {
		t.Fatalf("no drift: %v %v", fixed, err)
	}
	if fixed, err := s.Reconcile(ctx, id, n, truth(5)); err != nil || !fixed || leftOf(t, s, id, n) != 5 {
		t.Fatalf("too many: %v %v, left %d", fixed, err, leftOf(t, s, id, n))
	}
	if fixed, err := s.Reconcile(ctx, id, n, truth(7)); err != nil || !fixed || leftOf(t, s, id, n) != 7 {
		t.Fatalf("too few: %v %v, left %d", fixed, err, leftOf(t, s, id, n))
	}
	moving := func(context.Context) (int64, error) {
		rdb.Decr(ctx, stock.BucketKeys(id, n, 2).Stock)
		return 1, nil
	}
	if fixed, _ := s.Reconcile(ctx, id, n, moving); fixed || leftOf(t, s, id, n) != 6 {
		t.Fatalf("a bucket moved meanwhile: fixed %v, left %d", fixed, leftOf(t, s, id, n))
	}
	h, _, _ := s.Take(ctx, id, n, 1)
	if fixed, _ := s.Reconcile(ctx, id, n, truth(1)); fixed {
		t.Fatal("reconciled with a hold open")
	}
	s.GiveBack(ctx, h, true)
}

// One bucket lost (its master lost its data): Load rebuilds that bucket
// alone, with its home buyers and what MySQL has beyond the other buckets.
func TestBucketsLoadOneLost(t *testing.T) {
	rdb := testenv.Redis(t, 0)
	s := stock.NewStore(rdb, time.Minute)
	ctx := context.Background()
	const n = 2
	id := newBucketed(t, rdb, s, 10, n) // 5, 5
	buyer := usersAt(1, n, 1)[0]
	k := stock.BucketKeys(id, n, 1)
	rdb.Del(ctx, k.Stock, k.Buyers)
	if _, res, _ := s.Take(ctx, id, n, buyer); res != stock.Missing {
		t.Fatalf("take with bucket 1 lost: %v, want Missing", res)
	}
	if _, ok, _ := s.Left(ctx, id, n); ok {
		t.Fatal("Left with a bucket lost: ok")
	}
	// MySQL: 9 left (one sold, to buyer).
	if loaded, err := s.Load(ctx, id, n, 9, []int64{buyer}, nil, nil); err != nil || !loaded {
		t.Fatalf("load: %v %v", loaded, err)
	}
	if got := rdb.Get(ctx, k.Stock).Val(); got != "4" {
		t.Fatalf("bucket 1 reloaded with %s, want 4", got)
	}
	if loaded, _ := s.Load(ctx, id, n, 9, nil, nil, nil); loaded {
		t.Fatal("loaded twice")
	}
	if _, res, _ := s.Take(ctx, id, n, buyer); res != stock.AlreadyBought {
		t.Fatalf("the buyer after the reload: %v", res)
	}
}

// On a cluster of three masters, a voucher of three buckets puts one on
// each, and a crowd of distinct users spreads its scripts evenly: each
// master runs a third of them, within 5% of a third.
func TestBucketsSpreadOverMasters(t *testing.T) {
	c := testenv.StartCluster(t)
	rdb := c.Client(t)
	s := stock.NewStore(rdb, time.Minute)
	ctx := context.Background()
	const n = 3
	id := newBucketed(t, rdb, s, 1_000_000, n)
	masters := map[string]int{}
	for b := range n {
		masters[c.MasterOf(t, stock.BucketKeys(id, n, b).Stock).Addr()]++
	}
	if len(masters) != 3 {
		t.Fatalf("3 buckets on %d masters: %v", len(masters), masters)
	}
	calls := spread(t, c, func(u int64) {
		if _, res, err := s.Take(ctx, id, n, u); err != nil || res != stock.Taken {
			t.Fatalf("take: %v %v", res, err)
		}
	}, 12_000)
	testenv.EvenShares(t, calls)
}

// spread resets the masters' command statistics, runs take for users
// 1..users from 16 goroutines, and returns each master's script calls.
func spread(t testing.TB, c *testenv.Cluster, take func(user int64), users int64) map[string]int64 {
	t.Helper()
	c.ResetStats(t)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for u := next.Add(1); u <= users; u = next.Add(1) {
				take(u)
			}
		})
	}
	wg.Wait()
	return c.ScriptCalls(t)
}

// BenchmarkBucketedTake takes units of a hot voucher of three buckets on a
// three-master cluster, every take a new user, and reports each master's
// share of the script calls.
//
//	SECKILL_TEST_REDIS_ADDR=127.0.0.1:6379 go test -run '^$' -bench BenchmarkBucketedTake ./internal/stock/
func BenchmarkBucketedTake(b *testing.B) {
	c := testenv.StartCluster(b)
	rdb := c.Client(b)
	s := stock.NewStore(rdb, time.Minute)
	ctx := context.Background()
	for _, n := range []int{1, 3} {
		b.Run(fmt.Sprintf("buckets=%d", n), func(b *testing.B) {
			id := newBucketed(b, rdb, s, math.MaxInt32, n)
			var users atomic.Int64
			c.ResetStats(b)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, res, err := s.Take(ctx, id, n, users.Add(1)); err != nil || res != stock.Taken {
						b.Errorf("take: %v %v", res, err)
						return
					}
				}
			})
			b.StopTimer()
			calls := c.ScriptCalls(b)
			var total, most int64
			for _, v := range calls {
				total += v
				most = max(most, v)
			}
			b.ReportMetric(float64(most)/float64(max(total, 1)), "busiest-master-share")
		})
	}
}

// A lost bucket gets what MySQL has left beyond the other buckets' stock
// and the units under their holds; a claim is no unit and is not counted.
func TestBucketsLoadCountsHoldsNotClaims(t *testing.T) {
	rdb := testenv.Redis(t, 0)
	s := stock.NewStore(rdb, time.Minute)
	ctx := context.Background()
	const n = 3
	id := newBucketed(t, rdb, s, 9, n) // 3, 3, 3
	home1 := usersAt(1, n, 4)
	for _, u := range home1[:3] { // bucket 1 sold out, orders written
		h, res, err := s.Take(ctx, id, n, u)
		if err != nil || res != stock.Taken || h.From != 1 {
			t.Fatalf("take: %v %v from %d", res, err, h.From)
		}
		s.Confirm(ctx, h)
	}
	// In flight: a unit of bucket 2 under a hold, its buyer claimed in 1.
	if h, res, err := s.Take(ctx, id, n, home1[3]); err != nil || res != stock.Taken || h.From != 2 {
		t.Fatalf("take from elsewhere: %v %v from %d", res, err, h.From)
	}
	k := stock.BucketKeys(id, n, 0)
	rdb.Del(ctx, k.Stock, k.Buyers)
	// MySQL: 9 - 3 orders = 6 left.
	if loaded, err := s.Load(ctx, id, n, 6, home1[:3], nil, nil); err != nil || !loaded {
		t.Fatalf("load: %v %v", loaded, err)
	}
	if got := rdb.Get(ctx, k.Stock).Val(); got != "3" {
		t.Fatalf("bucket 0 reloaded with %s units, want 3 (6 left - 2 in bucket 2 - 1 held)", got)
	}
}
