package main

import (
	"context"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/routers/legacy"
	"github.com/redis/go-redis/v9"

	"seckill/internal/fleet"
	"seckill/internal/order/queue"
	"seckill/internal/testenv"
)

// versionsDB is the Redis database of the tests of versions that know
// each other: theirs alone, as an older instance announced in a shared
// database would refuse the other tests' rooms.
const versionsDB = 6

// Two instances of this version, one in each mode, on one stack; a fake
// instance of an older version announces itself beside them (as it would,
// had it been built to). While it is alive a room is refused 409
// upgrade_pending on both, naming it; when it leaves, or its announcement
// goes stale, the same request is created. A split voucher is refused
// only by the async instance, and only while a consumer that cannot read
// its entries is alive. /readyz and /metrics show every version alive.
func TestOlderInstanceRefusesWhatItCannotServe(t *testing.T) {
	st := newStack(t, versionsDB)
	async := start(t, st.env(freeAddr(t), "SECKILL_MODE", "async"))
	sync := start(t, st.env(freeAddr(t)))
	admin, _ := mustLogin(t, async.Base, adminPhone)
	rdb := testenv.Redis(t, versionsDB)
	router, err := legacy.NewRouter(openAPI(t))
	if err != nil {
		t.Fatal(err)
	}
	onAsync, onSync := contract{t: t, base: async.Base, router: router}, contract{t: t, base: sync.Base, router: router}

	ctx := context.Background()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	// Level 6: before the waiting room; its consumer reads split
	// vouchers' entries. Level 4: before async mode's split vouchers.
	beforeRooms := fleet.New(rdb, fleet.Instance{Name: "old-host:8080", Revision: "bbc12cd00000", Level: 6, Mode: "async",
		Reads: []string{fleet.FormatOrder, fleet.FormatBucket}, Started: time.Now()}, fleet.Fresh, quiet)
	beforeSplit := fleet.New(rdb, fleet.Instance{Name: "older-host:8080", Revision: "b3411b600000", Level: 4, Mode: "async",
		Reads: []string{fleet.FormatOrder}, Started: time.Now()}, fleet.Fresh, quiet)

	when := func(from time.Duration) (string, string) {
		return time.Now().Add(from).UTC().Format(time.RFC3339), time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	}
	begin, end := when(time.Minute)
	room := map[string]any{"title": "room", "stock": 5, "begin_time": begin, "end_time": end, "room": map[string]any{"admit_per_second": 10}}
	split := map[string]any{"title": "split", "stock": 6, "begin_time": begin, "end_time": end, "buckets": 3}
	plain := map[string]any{"title": "plain", "stock": 6, "begin_time": begin, "end_time": end}
	const valid = true
	refused := func(c contract, body map[string]any, key string, names ...string) {
		t.Helper()
		var header map[string]string
		if key != "" {
			header = map[string]string{"Idempotency-Key": key}
		}
		_, b := c.expect(409, "upgrade_pending", "POST", "/vouchers", admin, body, header, valid)
		e, _ := b["error"].(map[string]any)
		msg, _ := e["message"].(string)
		for _, n := range names {
			if !strings.Contains(msg, n) {
				t.Errorf("the refusal %q does not name %s", msg, n)
			}
		}
	}

	// Nobody older: everything is made.
	onAsync.expect(201, "", "POST", "/vouchers", admin, room, nil, valid)
	onAsync.expect(201, "", "POST", "/vouchers", admin, split, nil, valid)

	if err := beforeRooms.Announce(ctx); err != nil {
		t.Fatal(err)
	}
	refused(onAsync, room, "room-after-upgrade", "old-host:8080", "bbc12cd00000", "level 6", "level 7")
	refused(onSync, room, "", "old-host:8080")
	onAsync.expect(201, "", "POST", "/vouchers", admin, split, nil, valid) // level 6 reads them
	onAsync.expect(201, "", "POST", "/vouchers", admin, plain, nil, valid)

	if err := beforeSplit.Announce(ctx); err != nil {
		t.Fatal(err)
	}
	refused(onAsync, split, "", "older-host:8080", "b3411b600000", "level 5")
	onSync.expect(201, "", "POST", "/vouchers", admin, split, nil, valid) // sync mode queues nothing
	onAsync.expect(201, "", "POST", "/vouchers", admin, plain, nil, valid)

	// Every version shows, on each instance, once its next announcement
	// has read them (every fleet.Every).
	self := fleet.Revision()
	want := map[string]int{
		"old-host:8080": 6, "older-host:8080": 4,
		nameOf(async): int(fleet.Current), nameOf(sync): int(fleet.Current),
	}
	for _, in := range []*instance{async, sync} {
		waitReadyShows(t, in.Base, want, self)
		checkInstancesGauge(t, in.Base, admin, map[string]float64{self + "/" + strconv.Itoa(int(fleet.Current)): 2, "bbc12cd00000/6": 1, "b3411b600000/4": 1})
	}

	// A consumer of the orders that announces nothing (an instance of
	// level 7 or before, whose consumer is named as it would be) is
	// listed apart by the async instance, which watches the streams.
	if err := rdb.XGroupCreateConsumer(ctx, queue.StreamKey(0), queue.GroupName, "legacy-host:8080").Err(); err != nil {
		t.Fatal(err)
	}
	waitUnannounced(t, async.Base, "legacy-host:8080")

	// The level-4 instance stops cleanly: it takes its announcement back.
	// The level-6 one is killed: its announcement goes stale (here: it
	// was last seen a minute ago, by Redis' clock).
	if err := beforeSplit.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	onAsync.expect(201, "", "POST", "/vouchers", admin, split, nil, valid)
	refused(onAsync, room, "", "old-host:8080")
	_, seen := fleet.Keys()
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.ZAdd(ctx, seen, redis.Z{Score: float64(now.Add(-time.Minute).UnixMilli()), Member: "old-host:8080"}).Err(); err != nil {
		t.Fatal(err)
	}
	// The key the refusal was sent with is not spent: the same request
	// goes through once the upgrade is over.
	onAsync.expect(201, "", "POST", "/vouchers", admin, room, map[string]string{"Idempotency-Key": "room-after-upgrade"}, valid)
	onSync.expect(201, "", "POST", "/vouchers", admin, room, nil, valid)

	only := map[string]int{nameOf(async): int(fleet.Current), nameOf(sync): int(fleet.Current)}
	waitReadyShows(t, async.Base, only, self)
	checkInstancesGauge(t, async.Base, admin, map[string]float64{self + "/" + strconv.Itoa(int(fleet.Current)): 2})

	// An instance that stops takes its own announcement back.
	if err := sync.Stop(); err != nil {
		t.Fatal(err)
	}
	instances, _ := fleet.Keys()
	if rdb.HExists(ctx, instances, nameOf(sync)).Val() {
		t.Error("a stopped instance is still announced")
	}
}

// waitReadyShows waits until base's /readyz lists exactly want (instance
// -> level), itself with version self, within two announcements.
func waitReadyShows(t *testing.T, base string, want map[string]int, self string) {
	t.Helper()
	deadline := time.Now().Add(2*fleet.Every + time.Second)
	for {
		r := mustCall(t, "GET", base+"/readyz", "", nil)
		got := map[string]int{}
		list, _ := r.Body["instances"].([]any)
		for _, x := range list {
			in, _ := x.(map[string]any)
			name, _ := in["instance"].(string)
			level, _ := in["level"].(float64)
			got[name] = int(level)
		}
		ok := r.Status == http.StatusOK && r.Str("version") == self && r.Body["level"] == float64(fleet.Current) && len(got) == len(want)
		for n, l := range want {
			ok = ok && got[n] == l
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s/readyz: %s; want version %s, level %d, instances %v", base, r.Raw, self, fleet.Current, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// checkInstancesGauge checks seckill_instances on base's /metrics:
// "version/level" -> instances.
func checkInstancesGauge(t *testing.T, base, admin string, want map[string]float64) {
	t.Helper()
	got := map[string]float64{}
	if fam := scrape(t, base+"/metrics", admin)["seckill_instances"]; fam != nil {
		for _, m := range fam.GetMetric() {
			var version, level string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "version":
					version = l.GetValue()
				case "level":
					level = l.GetValue()
				}
			}
			got[version+"/"+level] = m.GetGauge().GetValue()
		}
	}
	if !maps.Equal(got, want) {
		t.Errorf("seckill_instances on %s: %v, want %v", base, got, want)
	}
}

// nameOf is the name in's announcement: its consumer's default name,
// the host's name and the port.
func nameOf(in *instance) string {
	host, _ := os.Hostname()
	_, port, _ := net.SplitHostPort(in.Base[len("http://"):])
	return host + ":" + port
}

// waitUnannounced waits until base's /readyz lists exactly the consumer
// name among those that announce nothing, within two announcements.
func waitUnannounced(t *testing.T, base, name string) {
	t.Helper()
	deadline := time.Now().Add(2*fleet.Every + time.Second)
	for {
		r := mustCall(t, "GET", base+"/readyz", "", nil)
		list, _ := r.Body["unannounced_consumers"].([]any)
		if len(list) == 1 {
			c, _ := list[0].(map[string]any)
			if idle, ok := c["idle_ms"].(float64); c["consumer"] == name && ok && idle >= 0 && idle < 60_000 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s/readyz: %s; want unannounced_consumers [%s]", base, r.Raw, name)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
