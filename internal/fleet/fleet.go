// Package fleet lets the instances of the server know each other's
// versions, so that a feature an older instance cannot serve is refused
// while one is still running, instead of half working.
//
// During a rolling upgrade old and new instances run side by side on one
// MySQL and one Redis. Most changes are made so that both serve every
// request correctly (docs/upgrading.md), but a few features cannot be:
// an older consumer of async mode's stream reads a split voucher's
// orders as malformed, and an older instance ignores a voucher's waiting
// room and sells to anyone. Such a feature must wait until the last older
// instance has stopped. Nobody has to remember that: each instance says
// who it is in Redis, and the admin's create asks who is alive.
//
// The idea, in Redis: one hash, seckill:{fleet}:instances, holds a field
// per instance (its name: CONSUMER_NAME, by default host:port) whose value
// is its announcement in JSON: its build's revision, its feature Level
// (levels.go: what each level added), its mode, and the stream entry
// formats its consumer reads. Beside it, seckill:{fleet}:seen, a sorted
// set, holds when each last announced, and seckill:{fleet}:started when
// the process under each name started: of two under one name, the one
// started last keeps it. Every instance announces itself again every few
// seconds (Run); an announcement older than Fresh is stale, and whoever
// runs the script next deletes it; the keys expire once nobody has
// announced for Fresh. An instance that stops cleanly takes its own back
// (Leave); one that is killed goes stale. The keys share the {fleet} hash
// tag, so they live in one slot and each step is one script on one node:
// the same on one Redis, behind
// Sentinel and on a Redis Cluster. The times are Redis' clock, not the
// instances', whose clocks may disagree.
//
// What it cannot do: see an instance of a version from before it (levels
// 1 to 7). Those announce nothing. The first version that announces is
// level 8; an upgrade from an earlier one still follows the notes of
// docs/upgrading.md by hand. In async mode there is a hint: such an
// instance's consumer reads the orders' streams under its name, so the
// consumers that announce nothing are listed apart, with how long since
// each last read (WatchConsumers, Unannounced); nothing is refused for
// them, as their version is unknown.
package fleet

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/apperr"
)

// The fleet's keys, in one slot ({fleet}).
const (
	instancesKey = "seckill:{fleet}:instances"
	seenKey      = "seckill:{fleet}:seen"
	// startedKey: when each instance announced there started, in ms. Of
	// two processes under one name (a replacement announcing while the
	// instance it replaces drains), the one started last keeps the name:
	// the older stops overwriting its announcement.
	startedKey = "seckill:{fleet}:started"
)

// Keys are the fleet's keys, for a reader (an operator's redis-cli, a
// test).
func Keys() (instances, seen string) { return instancesKey, seenKey }

var (
	//go:embed announce.lua
	announceSrc    string
	announceScript = redis.NewScript(announceSrc)
	//go:embed leave.lua
	leaveSrc    string
	leaveScript = redis.NewScript(leaveSrc)
)

// Every is how often an instance announces itself, and Fresh how long an
// announcement counts: four missed announcements, so that a slow Redis
// or a long GC pause does not drop a live instance, while a killed one is
// forgotten within half a minute.
const (
	Every = 5 * time.Second
	Fresh = 20 * time.Second
)

// An Instance is one server's announcement.
type Instance struct {
	Name     string    `json:"instance"`
	Revision string    `json:"version"` // the build's VCS revision, or "dev"
	Level    Level     `json:"level"`
	Mode     string    `json:"mode"`  // sync or async
	Reads    []string  `json:"reads"` // the stream entry formats its consumer reads; none in sync mode
	Started  time.Time `json:"started_at"`
	// Seen is when it last announced, by Redis' clock. Not in the
	// announcement (zero there): the seen set keeps it.
	Seen time.Time `json:"seen_at,omitzero"`
}

// Self is this process's announcement, named name, in mode.
func Self(name, mode string, started time.Time) Instance {
	in := Instance{Name: name, Revision: Revision(), Level: Current, Mode: mode, Reads: []string{}, Started: started.UTC().Truncate(time.Millisecond)}
	if mode == "async" {
		in.Reads = slices.Clone(Reads)
	}
	return in
}

// Revision is the VCS revision the binary was built from (go build
// stamps it from the git checkout), its first 12 digits, with "+dirty"
// when the tree had changes; "dev" when not stamped (go run, go test).
func Revision() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "dev"
	}
	rev, dirty := "", false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "dev"
	}
	rev = rev[:min(len(rev), 12)]
	if dirty {
		rev += "+dirty"
	}
	return rev
}

// Fleet announces one instance and reads the others. It is safe for
// concurrent use.
type Fleet struct {
	rdb   redis.UniversalClient
	self  Instance
	fresh time.Duration
	log   *slog.Logger

	// streams and group, in async mode: the orders' streams, whose
	// consumers that announce nothing Announce looks for (WatchConsumers).
	streams []string
	group   string

	mu     sync.Mutex
	last   []Instance // the live instances as the last announcement found them
	silent []Consumer // and the consumers that announce nothing
}

// New returns the Fleet that announces self in rdb; an announcement
// counts for fresh (Fresh in the server).
func New(rdb redis.UniversalClient, self Instance, fresh time.Duration, log *slog.Logger) *Fleet {
	return &Fleet{rdb: rdb, self: self, fresh: fresh, log: log}
}

// Self is the instance f announces.
func (f *Fleet) Self() Instance { return f.self }

// Announce says in Redis that this instance is alive, and remembers who
// else is (Known).
func (f *Fleet) Announce(ctx context.Context) error {
	body, err := json.Marshal(f.self)
	if err != nil {
		return err
	}
	live, err := f.run(ctx, f.self.Name, string(body))
	if err != nil {
		return fmt.Errorf("announce instance %s: %w", f.self.Name, err)
	}
	silent, err := f.consumers(ctx, live)
	f.mu.Lock()
	f.last = live
	if err == nil {
		f.silent = silent
	}
	f.mu.Unlock()
	return err
}

// WatchConsumers makes Announce list, besides, the consumers of the
// group on streams that announce nothing: an instance of a version from
// before announcing, whose consumer is named as its announcement would
// be (CONSUMER_NAME), or one that is gone (the group forgets a consumer
// an hour after its last entry: package order/queue). Async mode only;
// call it before Run. It costs one XINFO CONSUMERS a stream each
// announcement, in one pipeline.
func (f *Fleet) WatchConsumers(streams []string, group string) {
	f.streams, f.group = streams, group
}

// A Consumer is a consumer of the orders' streams that announces nothing.
type Consumer struct {
	Name string `json:"consumer"`
	// Idle is how long since it last read, on the stream it read last
	// (XINFO CONSUMERS' idle). Redis 7.2 and later count any read; Redis
	// before 7.2 only one that was given entries, so a live consumer of
	// a quiet queue looks idle there.
	Idle time.Duration `json:"-"`
	// IdleMS is Idle in milliseconds, for /readyz.
	IdleMS int64 `json:"idle_ms"`
}

// Unannounced is the consumers the last announcement found that announce
// nothing (WatchConsumers), by name: a hint of instances of a version
// before announcing, whose version nobody knows. Nothing is refused for
// them.
func (f *Fleet) Unannounced() []Consumer {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.silent)
}

// consumers lists the consumers of the watched streams that are not
// among live, each with its least idle time.
func (f *Fleet) consumers(ctx context.Context, live []Instance) ([]Consumer, error) {
	if len(f.streams) == 0 {
		return nil, nil
	}
	pipe := f.rdb.Pipeline()
	cmds := make([]*redis.XInfoConsumersCmd, len(f.streams))
	for i, s := range f.streams {
		cmds[i] = pipe.XInfoConsumers(ctx, s, f.group)
	}
	pipe.Exec(ctx) // each command's error is read below
	announced := map[string]bool{}
	for _, in := range live {
		announced[in.Name] = true
	}
	idle := map[string]time.Duration{}
	for i, c := range cmds {
		cs, err := c.Result()
		if err != nil {
			// A stream or group not made yet has no consumer.
			if strings.Contains(err.Error(), "NOGROUP") || strings.Contains(err.Error(), "no such key") {
				continue
			}
			return nil, fmt.Errorf("list the consumers of %s: %w", f.streams[i], err)
		}
		for _, x := range cs {
			if d, ok := idle[x.Name]; !announced[x.Name] && (!ok || x.Idle < d) {
				idle[x.Name] = x.Idle
			}
		}
	}
	out := []Consumer{}
	for _, name := range slices.Sorted(maps.Keys(idle)) {
		out = append(out, Consumer{Name: name, Idle: idle[name], IdleMS: idle[name].Milliseconds()})
	}
	return out, nil
}

// Run announces the instance every interval until ctx ends. A failed
// announcement is logged and tried again at the next tick: if they keep
// failing the others forget this instance after Fresh, which only lets
// them make what it may not serve, and this instance is then not
// serving anyway (Redis is down).
func (f *Fleet) Run(ctx context.Context, every time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if err := f.Announce(ctx); err != nil && ctx.Err() == nil {
				f.log.Warn("announce this instance", "err", err)
			}
		}
	}
}

// Leave takes this instance's announcement back: it is stopping.
func (f *Fleet) Leave(ctx context.Context) error {
	body, err := json.Marshal(f.self)
	if err != nil {
		return err
	}
	if err := leaveScript.Run(ctx, f.rdb, []string{instancesKey, seenKey, startedKey}, f.self.Name, string(body)).Err(); err != nil {
		return fmt.Errorf("take back the announcement of %s: %w", f.self.Name, err)
	}
	return nil
}

// Live reads the instances alive now, in name order.
func (f *Fleet) Live(ctx context.Context) ([]Instance, error) {
	live, err := f.run(ctx, "", "")
	if err != nil {
		return nil, fmt.Errorf("read the live instances: %w", err)
	}
	return live, nil
}

// Known is the live instances as the last announcement found them (at
// most Every old), without asking Redis: for /readyz and /metrics, which
// are asked often.
func (f *Fleet) Known() []Instance {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.last)
}

// run runs announce.lua, announcing name (unless "") and returning the
// live instances.
func (f *Fleet) run(ctx context.Context, name, body string) ([]Instance, error) {
	res, err := announceScript.Run(ctx, f.rdb, []string{instancesKey, seenKey, startedKey}, name, body, f.fresh.Milliseconds(), f.self.Started.UnixMilli()).Slice()
	if err != nil {
		return nil, err
	}
	if len(res) == 0 || (len(res)-1)%3 != 0 {
		return nil, fmt.Errorf("announce.lua answered %d values", len(res))
	}
	live := make([]Instance, 0, len(res)/3)
	for i := 1; i+2 < len(res); i += 3 {
		id, _ := res[i].(string)
		seenMs, _ := res[i+1].(string)
		raw, _ := res[i+2].(string)
		in := Instance{Name: id}
		if err := json.Unmarshal([]byte(raw), &in); err != nil {
			// Unreadable, yet alive: counted as the oldest, so that it
			// blocks every feature that needs a level.
			in = Instance{Name: id, Revision: "unknown"}
		}
		in.Name = id
		if in.Reads == nil {
			in.Reads = []string{}
		}
		var ms int64
		fmt.Sscan(seenMs, &ms)
		in.Seen = time.UnixMilli(ms).UTC()
		live = append(live, in)
	}
	sort.Slice(live, func(i, j int) bool { return live[i].Name < live[j].Name })
	return live, nil
}

// Require refuses needs while a live instance cannot serve one of them:
// one of a lower level, or in async mode one whose consumer does not read
// the entries the need's orders are queued in; it reads who is alive
// once, and not at all for no needs. The refusal is a *Blocked, which
// the API answers 409 upgrade_pending, naming the instance. A failure to
// read Redis is returned as it is.
func (f *Fleet) Require(ctx context.Context, needs ...Need) error {
	if len(needs) == 0 {
		return nil
	}
	live, err := f.Live(ctx)
	if err != nil {
		return err
	}
	for _, need := range needs {
		if in, ok := Blocking(live, need); ok {
			return &Blocked{Need: need, By: in}
		}
	}
	return nil
}

// Blocking finds the first of live that cannot serve need.
func Blocking(live []Instance, need Need) (Instance, bool) {
	for _, in := range live {
		if in.Level < need.Level {
			return in, true
		}
		if need.Reads != "" && in.Mode == "async" && !slices.Contains(in.Reads, need.Reads) {
			return in, true
		}
	}
	return Instance{}, false
}

// ErrUpgradePending is the code of every refusal Require makes (compare
// with errors.Is); each carries a message of its own, naming the
// instance.
var ErrUpgradePending = apperr.New(apperr.UpgradePending, "an instance of an older version is still running")

// Blocked is Require's refusal: By cannot serve Need.
type Blocked struct {
	Need Need
	By   Instance
}

func (b *Blocked) Error() string { return b.message() }

// Unwrap is the client's answer: its message names the instance and its
// version (they are the operator's own, and an admin is asking).
func (b *Blocked) Unwrap() error { return apperr.New(apperr.UpgradePending, b.message()) }

// Is makes errors.Is(err, ErrUpgradePending) hold.
func (b *Blocked) Is(target error) bool { return target == ErrUpgradePending }

func (b *Blocked) message() string {
	why := fmt.Sprintf("level %d", b.By.Level)
	if b.By.Level >= b.Need.Level {
		why = fmt.Sprintf("level %d, whose consumer does not read %q entries", b.By.Level, b.Need.Reads)
	}
	return fmt.Sprintf("%s needs every running instance at level %d or above, and instance %s runs version %s (%s): finish the upgrade first (docs/upgrading.md)",
		b.Need.Feature, b.Need.Level, b.By.Name, b.By.Revision, why)
}
