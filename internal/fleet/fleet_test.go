package fleet

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"seckill/internal/apperr"
	"seckill/internal/stock"
	"seckill/internal/testenv"
)

// redisDB is this package's own logical database, flushed by each test:
// the fleet's keys are fixed, and an older instance announced in a
// database other tests share would refuse their rooms.
const redisDB = 5

func freshRedis(t *testing.T) *redis.Client {
	t.Helper()
	rdb := testenv.Redis(t, redisDB)
	if err := rdb.FlushDB(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	return rdb
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// older is an instance of the level before the waiting room, in async
// mode, reading only plain entries.
func older(name string) Instance {
	return Instance{Name: name, Revision: "eb3ad20aaaaa", Level: 6, Mode: "async", Reads: []string{FormatOrder, FormatBucket}}
}

// announce announces each of fleets once.
func announce(t *testing.T, fleets ...*Fleet) {
	t.Helper()
	for _, f := range fleets {
		if err := f.Announce(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

func names(live []Instance) string {
	var s []string
	for _, in := range live {
		s = append(s, in.Name)
	}
	return strings.Join(s, ",")
}

// Two instances announce; each sees both, with what they announced and
// when Redis last saw them; one leaves, and is gone at once.
func TestAnnounceAndLeave(t *testing.T) {
	ctx := context.Background()
	rdb := freshRedis(t)
	started := time.Now()
	a := New(rdb, Self("a:8080", "async", started), Fresh, quiet)
	b := New(rdb, Self("b:8080", "sync", started), Fresh, quiet)
	announce(t, a, b)
	live, err := a.Live(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if names(live) != "a:8080,b:8080" {
		t.Fatalf("live %q, want a:8080,b:8080", names(live))
	}
	got := live[0]
	if got.Level != Current || got.Revision != Revision() || got.Mode != "async" || strings.Join(got.Reads, ",") != FormatOrder+","+FormatBucket {
		t.Errorf("a announced %+v", got)
	}
	if len(live[1].Reads) != 0 {
		t.Errorf("a sync instance reads %v, want nothing", live[1].Reads)
	}
	if d := time.Since(got.Seen); d < -5*time.Second || d > 5*time.Second {
		t.Errorf("a seen at %v, %v from now", got.Seen, d)
	}
	for _, k := range []string{instancesKey, seenKey} {
		if ttl := rdb.PTTL(ctx, k).Val(); ttl <= 0 || ttl > Fresh {
			t.Errorf("%s expires in %v, want within %v (every announcement in it is stale by then)", k, ttl, Fresh)
		}
	}
	if names(b.Known()) != "a:8080,b:8080" {
		t.Errorf("b knows %q after announcing, want both", names(b.Known()))
	}

	if err := b.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if live, err = a.Live(ctx); err != nil || names(live) != "a:8080" {
		t.Fatalf("after b left: live %q (%v), want a:8080", names(live), err)
	}
	if n := rdb.HLen(ctx, instancesKey).Val() + rdb.ZCard(ctx, seenKey).Val(); n != 2 {
		t.Errorf("%d fields and members after b left, want a's two", n)
	}
}

// Under a fixed name (a StatefulSet's), the replacement announces while
// the instance it replaces drains; the old one's Leave, at the end of its
// drain, leaves the replacement's announcement alone.
func TestLeaveTakesOnlyItsOwn(t *testing.T) {
	ctx := context.Background()
	rdb := freshRedis(t)
	old := New(rdb, Self("web-0:8080", "async", time.Now().Add(-time.Hour)), Fresh, quiet)
	replacement := New(rdb, Self("web-0:8080", "async", time.Now()), Fresh, quiet)
	// The old one announces again after the replacement did (its drain's
	// last tick): that changes nothing, and its leave takes nothing.
	announce(t, old, replacement, old)
	if err := old.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	live, err := replacement.Live(ctx)
	if err != nil || len(live) != 1 || !live[0].Started.Equal(replacement.Self().Started) {
		t.Fatalf("after the old one left: %+v (%v), want the replacement's announcement", live, err)
	}
	if err := replacement.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if live, err := old.Live(ctx); err != nil || len(live) != 0 {
		t.Errorf("after the replacement left: %+v (%v), want none", live, err)
	}
}

// An instance that stops announcing (killed) is not alive once its last
// announcement is older than fresh, and whoever reads next deletes it.
func TestStaleInstanceForgotten(t *testing.T) {
	ctx := context.Background()
	rdb := freshRedis(t)
	const fresh = time.Second
	dead := New(rdb, older("dead:1"), fresh, quiet)
	alive := New(rdb, Self("alive:1", "async", time.Now()), fresh, quiet)
	if err := dead.Announce(ctx); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); alive.Run(runCtx, 200*time.Millisecond) }()
	t.Cleanup(func() { stop(); <-done })
	if err := alive.Announce(ctx); err != nil {
		t.Fatal(err)
	}
	if live, _ := alive.Live(ctx); names(live) != "alive:1,dead:1" {
		t.Fatalf("live %q, want both while fresh", names(live))
	}
	time.Sleep(fresh + 500*time.Millisecond)
	live, err := alive.Live(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if names(live) != "alive:1" {
		t.Fatalf("live %q %v after the dead one's announcement went stale, want alive:1 (announcing all along)", names(live), live)
	}
	if rdb.HExists(ctx, instancesKey, "dead:1").Val() || rdb.ZScore(ctx, seenKey, "dead:1").Err() != redis.Nil {
		t.Error("the stale announcement is still stored")
	}
}

// Require refuses a feature while an instance that cannot serve it is
// alive, with the API's 409 naming it, and lets it once that one left.
func TestRequireRefusesWhileOlderAlive(t *testing.T) {
	ctx := context.Background()
	rdb := freshRedis(t)
	self := New(rdb, Self("new:1", "async", time.Now()), Fresh, quiet)
	old := New(rdb, older("old:1"), Fresh, quiet)
	announce(t, self, old)
	err := self.Require(ctx, Room)
	var b *Blocked
	if !errors.As(err, &b) || b.By.Name != "old:1" || !errors.Is(err, ErrUpgradePending) {
		t.Fatalf("Require(Room) with a level-6 instance alive: %v, want Blocked by old:1", err)
	}
	e := apperr.As(err)
	if e == nil || e.Code != apperr.UpgradePending || apperr.Status(e.Code) != 409 ||
		!strings.Contains(e.Message, "old:1") || !strings.Contains(e.Message, "eb3ad20aaaaa") || !strings.Contains(e.Message, "level 7") {
		t.Errorf("the client's answer: %+v, want upgrade_pending (409) naming old:1, its version and the level needed", e)
	}
	if err := self.Require(ctx, SplitInAsync); err != nil {
		t.Errorf("Require(SplitInAsync): %v, want nil (level 6 reads bucket entries)", err)
	}
	if err := old.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if err := self.Require(ctx, Room); err != nil {
		t.Errorf("Require(Room) once the older instance left: %v", err)
	}
}

func TestBlocking(t *testing.T) {
	cur := Self("cur", "async", time.Now())
	sync := Self("sync", "sync", time.Now())
	plain := Instance{Name: "plain", Level: Current, Mode: "async", Reads: []string{FormatOrder}}
	low := Instance{Name: "low", Level: 4, Mode: "sync"}
	tests := []struct {
		name string
		live []Instance
		need Need
		by   string // "" none
	}{
		{"nobody", nil, Room, ""},
		{"all current", []Instance{cur, sync}, Room, ""},
		{"all current, split", []Instance{cur, sync}, SplitInAsync, ""},
		{"a lower level", []Instance{cur, low}, Room, "low"},
		{"a lower level, split", []Instance{low, cur}, SplitInAsync, "low"},
		{"an async consumer without the format", []Instance{cur, plain}, SplitInAsync, "plain"},
		{"without the format, a need without one", []Instance{plain}, Room, ""},
		{"an unreadable announcement", []Instance{{Name: "garbled"}}, Room, "garbled"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in, ok := Blocking(tt.live, tt.need)
			if ok != (tt.by != "") || in.Name != tt.by {
				t.Errorf("Blocking = %q, %v; want %q", in.Name, ok, tt.by)
			}
		})
	}
}

// Levels count up from 1 to Current, each named with what it added, and
// every need is of a level that exists.
func TestReleases(t *testing.T) {
	for i, r := range Releases {
		if r.Level != Level(i+1) || r.Added == "" {
			t.Errorf("Releases[%d] = %+v, want level %d with what it added", i, r, i+1)
		}
	}
	if last := Releases[len(Releases)-1].Level; last != Current {
		t.Errorf("the last release is level %d, Current %d", last, Current)
	}
	for _, n := range []Need{Room, SplitInAsync} {
		if n.Level < 1 || n.Level > Current {
			t.Errorf("%s needs level %d, which no release is", n.Feature, n.Level)
		}
	}
}

// The keys are in one Redis Cluster slot, so that each script runs on
// one node: Redis hashes only a key's first {tag}.
func TestKeysShareASlot(t *testing.T) {
	tag := func(key string) string {
		i := strings.IndexByte(key, '{')
		j := strings.IndexByte(key[i+1:], '}')
		if i < 0 || j <= 0 {
			return key
		}
		return key[i+1 : i+1+j]
	}
	if a, b, c := tag(instancesKey), tag(seenKey), tag(startedKey); a != b || a != c || stock.Slot(a) != stock.Slot(b) {
		t.Errorf("%s hashes %q, %s %q, %s %q", instancesKey, a, seenKey, b, startedKey, c)
	}
}

// The embedded demo's in-process Redis (miniredis) runs the scripts too.
func TestOnEmbeddedRedis(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	f := New(rdb, Self("demo:8080", "sync", time.Now()), Fresh, quiet)
	if err := f.Announce(ctx); err != nil {
		t.Fatal(err)
	}
	if live, err := f.Live(ctx); err != nil || names(live) != "demo:8080" {
		t.Fatalf("live %q (%v), want demo:8080", names(live), err)
	}
	if err := f.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if live, err := f.Live(ctx); err != nil || len(live) != 0 {
		t.Fatalf("live %q (%v) after leaving, want none", names(live), err)
	}
}

// The same steps on each topology the server supports: one Redis, a
// master behind Sentinel, and a Redis Cluster of three masters (where the
// keys' one slot is what lets each script run at all).
func TestOnEveryTopology(t *testing.T) {
	for _, topo := range []struct {
		name string
		rdb  func(t *testing.T) redis.UniversalClient
	}{
		{"one Redis", func(t *testing.T) redis.UniversalClient { return freshRedis(t) }},
		{"Sentinel", func(t *testing.T) redis.UniversalClient {
			s := testenv.StartSentinel(t)
			rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: s.Name, SentinelAddrs: s.Addrs()})
			t.Cleanup(func() { rdb.Close() })
			return rdb
		}},
		{"Cluster", func(t *testing.T) redis.UniversalClient { return testenv.StartCluster(t).Client(t) }},
	} {
		t.Run(topo.name, func(t *testing.T) {
			ctx := context.Background()
			rdb := topo.rdb(t)
			self := New(rdb, Self("new:1", "async", time.Now()), Fresh, quiet)
			old := New(rdb, older("old:1"), Fresh, quiet)
			announce(t, self, old)
			if live, err := self.Live(ctx); err != nil || names(live) != "new:1,old:1" {
				t.Fatalf("live %q (%v), want new:1,old:1", names(live), err)
			}
			if err := self.Require(ctx, Room); !errors.Is(err, ErrUpgradePending) {
				t.Errorf("Require(Room) with a level-6 instance alive: %v", err)
			}
			if err := old.Leave(ctx); err != nil {
				t.Fatal(err)
			}
			if err := self.Require(ctx, Room); err != nil {
				t.Errorf("Require(Room) once it left: %v", err)
			}
		})
	}
}

// The consumers of the orders' streams that announce nothing (an
// instance of a version before announcing) are listed apart, with how
// long since each last read.
func TestUnannouncedConsumers(t *testing.T) {
	ctx := context.Background()
	rdb := freshRedis(t)
	streams := []string{"test:{s0}:orders", "test:{s1}:orders"}
	for _, s := range streams {
		if err := rdb.XGroupCreateMkStream(ctx, s, "persist", "$").Err(); err != nil {
			t.Fatal(err)
		}
	}
	// Redis 7.0 makes a consumer when it is first given an entry.
	read := func(stream, consumer string) {
		t.Helper()
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []string{"id", "1"}}).Err(); err != nil {
			t.Fatal(err)
		}
		if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "persist", Consumer: consumer, Streams: []string{stream, ">"}, Count: 1, Block: -1}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	read(streams[0], "new:1")
	read(streams[1], "legacy:8080")
	read(streams[0], "legacy:8080")
	f := New(rdb, Self("new:1", "async", time.Now()), Fresh, quiet)
	if err := f.Announce(ctx); err != nil || f.Unannounced() != nil {
		t.Fatalf("without WatchConsumers: %v, unannounced %v", err, f.Unannounced())
	}
	f.WatchConsumers(append(streams, "test:{s2}:orders"), "persist") // a stream not made yet has no consumer
	if err := f.Announce(ctx); err != nil {
		t.Fatal(err)
	}
	got := f.Unannounced()
	if len(got) != 1 || got[0].Name != "legacy:8080" || got[0].Idle > 5*time.Second || got[0].IdleMS != got[0].Idle.Milliseconds() {
		t.Errorf("unannounced %+v, want legacy:8080 alone, idle a moment", got)
	}
}
