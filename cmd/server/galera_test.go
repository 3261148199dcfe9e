package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/testenv"
	"seckill/migrations"
)

// The service on a MariaDB Galera cluster of the test's own (issue 23):
// three nodes, each instance on its own node with the other two as
// MYSQL_NODES. One cluster serves every case in turn, each with a database
// and a Redis of its own.

// galeraFailover is the bound docs/galera.md states: a node SIGKILLed, every
// instance's orders commit again within it, those of the instance whose
// node died included. Writes stop everywhere until the cluster has
// declared the node gone (testenv.GaleraSuspect, plus about 1.5 s to
// install the new view); the instance on the dead node moves to the next
// one at once (its connections are reset, the next dial is refused), so it
// waits no longer than the others. The rest is slack for a loaded machine.
const galeraFailover = testenv.GaleraSuspect + 4*time.Second

func TestGalera(t *testing.T) {
	g := testenv.StartGalera(t, 3)
	// The sales with a node killed sell a voucher of three buckets on a
	// Redis Cluster of three masters: both tiers past one machine at once.
	c := testenv.StartCluster(t)
	t.Run("migrations at once on three nodes", func(t *testing.T) { galeraMigrations(t, g) })
	t.Run("conflicts retried", func(t *testing.T) { galeraConflicts(t, g) })
	t.Run("causal reads", func(t *testing.T) { galeraCausalReads(t, g) })
	// The node that dies is every instance's in sync mode (docs/galera.md's
	// layout: all through one node), one instance's in async mode (each
	// through its own).
	t.Run("node killed mid-sale/sync, all through it", func(t *testing.T) { galeraNodeKilled(t, g, c, "sync", true) })
	t.Run("node killed mid-sale/async, each through its own", func(t *testing.T) { galeraNodeKilled(t, g, c, "async", false) })
}

// galeraStack is a database on the cluster, with the service's user (all
// privileges on it, none elsewhere), and a Redis of its own.
type galeraStack struct {
	g     *testenv.Galera
	dsns  []string // the user's DSN on each node
	redis *testenv.RedisServer
}

func newGaleraStack(t *testing.T, g *testenv.Galera) galeraStack {
	t.Helper()
	name := testenv.Name("seckill_g")
	dsns := g.CreateUser(t, name[:min(len(name), 32)], name[:min(len(name), 32)])
	return galeraStack{g: g, dsns: dsns, redis: testenv.StartRedis(t)}
}

// env is the environment of an instance on node home, with the other
// nodes, in turn after it, as MYSQL_NODES.
func (s galeraStack) env(t *testing.T, home int, extra ...string) map[string]string {
	var others []string
	for i := 1; i < s.g.N(); i++ {
		others = append(others, s.g.Addr((home+i)%s.g.N()))
	}
	e := stack{DSN: s.dsns[home]}.env(freeAddr(t), extra...)
	e["REDIS_ADDR"] = s.redis.Addr()
	e["MYSQL_NODES"] = strings.Join(others, ",")
	return e
}

// startAll starts an instance per env at once, so that they migrate at
// once, and waits until each is healthy.
func startAll(t *testing.T, envs []map[string]string) []*instance {
	t.Helper()
	insts := make([]*instance, len(envs))
	exited := make([]chan error, len(envs))
	for i, env := range envs {
		ctx, cancel := context.WithCancel(context.Background())
		in := &instance{Base: "http://" + env["HTTP_ADDR"], stop: cancel, done: make(chan error, 1), log: &syncBuffer{}}
		insts[i], exited[i] = in, make(chan error, 1)
		go func() {
			err := run(ctx, func(k string) string { return env[k] }, in.log)
			in.done <- err
			exited[i] <- err
		}()
		t.Cleanup(func() {
			in.Stop()
			if t.Failed() {
				t.Logf("warnings and errors of %s:\n%s", in.Base, problems(in.log.String()))
			}
		})
	}
	for i, in := range insts {
		waitHealthy(t, in.Base, exited[i])
	}
	return insts
}

// galeraMigrations: six Apply calls at once, two through each node, on an
// empty database. With GET_LOCK alone, calls on different nodes each took
// their node's lock and migrated together (issue 23); with the lease, all
// succeed, and each version is applied once.
func galeraMigrations(t *testing.T, g *testenv.Galera) {
	st := newGaleraStack(t, g)
	ctx := context.Background()
	const perNode = 2
	var dbs []*sql.DB
	for _, dsn := range st.dsns {
		for range perNode {
			db, err := sql.Open("mysql", dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			if err := db.PingContext(ctx); err != nil {
				t.Fatal(err)
			}
			dbs = append(dbs, db)
		}
	}
	errs := make([]error, len(dbs))
	release := make(chan struct{})
	var wg sync.WaitGroup
	for i, db := range dbs {
		wg.Go(func() {
			<-release
			errs[i] = migrations.Apply(ctx, db, migrations.MySQL)
		})
	}
	close(release)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Apply %d, through node %d: %v", i, i/perNode, err)
		}
	}
	// What one server's migrations record, for comparison.
	want := appliedVersions(t, testenv.MySQLDSN(t))
	g.WaitSynced(t)
	for i, dsn := range st.dsns {
		if got := appliedVersions(t, dsn); !slices.Equal(got, want) {
			t.Errorf("node %d: schema_migrations holds %v, want %v once each", i, got, want)
		}
	}
}

func appliedVersions(t *testing.T, dsn string) []int {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	vs, err := migrations.Versions(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	return vs
}

// figures are what the instances counted of a sale: MySQL's certification
// conflicts, and the group commit's transactions and the orders in them.
type figures struct {
	conflicts      float64
	batches, units float64
}

func (f figures) meanBatch() float64 { return f.units / max(f.batches, 1) }

func scrapeFigures(t *testing.T, insts []*instance, admin string) figures {
	t.Helper()
	var f figures
	for _, in := range insts {
		fams := scrape(t, in.Base+"/metrics", admin)
		f.conflicts += max(value(fams, "seckill_mysql_conflicts_total"), 0)
		f.batches += max(value(fams, "seckill_group_commit_batch_size"), 0)
		f.units += max(histSum(fams, "seckill_group_commit_batch_size"), 0)
	}
	return f
}

// galeraConflicts: three instances, each on its own node, sell one
// voucher's 300 units to 600 buyers at once, each pressing once. Every
// order takes the same row (vouchers.stock): two nodes writing it at once
// cannot both commit, and Galera refuses the second with error 1213.
// Issue 23 saw those answered 503 and never retried (175 to 247 of 300
// units sold), and batches broken up into single orders that conflicted
// more; retried whole, as batches, every unit sells and batches grow.
func galeraConflicts(t *testing.T, g *testenv.Galera) {
	st := newGaleraStack(t, g)
	var envs []map[string]string
	for home := range g.N() {
		// Eight group-commit loops each: eight transactions at once per
		// node, racing the other nodes' for the row. With one, the
		// retried batches grow so large that a sale may take a handful
		// of transactions and meet no conflict at all.
		envs = append(envs, st.env(t, home, "GROUP_COMMIT_WRITERS", "8"))
	}
	insts := startAll(t, envs) // three instances migrate at once, each on its node
	const stock, buyers = 300, 600
	sale := pressOnce(t, insts, stock, buyers)
	l, vid, won, took, f := &sale.l, sale.vid, sale.won, sale.took, sale.f
	t.Logf("%d of %d units sold to %d buyers in %v; 503: %d; conflicts: %.0f; group commit: %.0f orders in %.0f transactions, %.1f a batch",
		len(won), stock, buyers, took.Round(time.Millisecond), l.count(http.StatusServiceUnavailable, "unavailable"), f.conflicts, f.units, f.batches, f.meanBatch())
	onlyExpected(t, l, "sold_out", "already_ordered")
	if len(won) != stock {
		t.Errorf("%d units sold to %d buyers, want all %d", len(won), buyers, stock)
	}
	if f.conflicts == 0 {
		t.Errorf("no certification conflict counted: the test provoked none, and proves nothing")
	}
	s := waitRest(t, testenv.Open(t, st.dsns[0]), st.redis.Client(t), vid, 10*time.Second)
	checkInvariants(t, s, stock, won)
	sameOnEveryNode(t, st, vid)
}

// sameOnEveryNode checks that every node holds the same stock and orders
// for the voucher.
// onceSale is what pressOnce saw.
type onceSale struct {
	l    ledger
	vid  string
	won  map[string]string
	took time.Duration
	f    figures
}

// pressOnce opens a voucher of units on insts, logs in buyers users, and
// has each press once, all released at once: a steady stream of small
// batches on every node, each racing the others for the voucher's row. It
// returns the answers, the rush's time and the instances' figures after.
func pressOnce(t *testing.T, insts []*instance, units, buyers int) *onceSale {
	t.Helper()
	admin, _ := mustLogin(t, insts[0].Base, adminPhone)
	sale := &onceSale{vid: openVoucher(t, insts[0].Base, admin, units)}
	users := loginMany(t, insts[1].Base, buyers)
	began := time.Now()
	rush(&sale.l, insts, users, sale.vid, 1)
	sale.took = time.Since(began)
	sale.won = sale.l.wins(t)
	sale.f = scrapeFigures(t, insts, admin)
	return sale
}

func sameOnEveryNode(t *testing.T, st galeraStack, vid string) {
	t.Helper()
	st.g.WaitSynced(t)
	var first string
	for i, dsn := range st.dsns {
		db, err := sql.Open("mysql", dsn)
		if err != nil {
			t.Fatal(err)
		}
		var left, orders, users int64
		err = db.QueryRow("SELECT stock, (SELECT COUNT(*) FROM voucher_orders WHERE voucher_id = ?), (SELECT COUNT(DISTINCT user_id) FROM voucher_orders WHERE voucher_id = ?) FROM vouchers WHERE id = ?", vid, vid, vid).Scan(&left, &orders, &users)
		db.Close()
		if err != nil {
			t.Fatalf("node %d: %v", i, err)
		}
		got := fmt.Sprintf("stock %d, orders %d, buyers %d", left, orders, users)
		if i == 0 {
			first = got
			t.Logf("every node: %s", got)
		} else if got != first {
			t.Errorf("node %d holds %s, node 0 %s", i, got, first)
		}
	}
}

// galeraNodeKilled: three instances, all through node 1 (allThrough) or
// each through its own node, sell 300 units to 600 buyers who arrive over
// six seconds and press again after a 503. A third of the way in, node 1
// is SIGKILLed. Each instance must sell again within galeraFailover of the
// kill, those whose node died through the next node; the sale adds up;
// node 1 comes back (IST) and holds what the others hold.
func galeraNodeKilled(t *testing.T, g *testenv.Galera, c *testenv.Cluster, mode string, allThrough bool) {
	const stock, buyers, victim = 300, 600, 1
	st := newGaleraStack(t, g)
	// Each sale's database is new, and numbers its vouchers from 1: the
	// cluster forgets the sale before.
	err := c.Client(t).ForEachMaster(context.Background(), func(ctx context.Context, m *redis.Client) error {
		return m.FlushAll(ctx).Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	var envs []map[string]string
	for i := range g.N() {
		home := i
		if allThrough {
			home = victim
		}
		env := st.env(t, home, "SECKILL_MODE", mode, "REDIS_ADDRS", strings.Join(c.Addrs(), ","))
		delete(env, "REDIS_ADDR")
		envs = append(envs, env)
	}
	insts := startAll(t, envs)
	admin, _ := mustLogin(t, insts[0].Base, adminPhone)
	vid := createVoucher(t, insts[0].Base, admin, stock, time.Now().Add(-time.Minute), time.Now().Add(time.Hour), "buckets", 3)
	users := loginMany(t, insts[1].Base, buyers)
	db, rdb := testenv.Open(t, st.dsns[0]), c.Client(t)

	// Each buyer keeps to one instance, so that each instance's answers
	// tell how it fared.
	type answer struct {
		at     time.Time
		inst   int
		status int
	}
	var (
		l       ledger
		mu      sync.Mutex
		answers []answer
		sold    atomic.Int64
		killed  = make(chan time.Time, 1)
	)
	rose := watchOrders(t, st.dsns[0], vid)
	step := 6 * time.Second / buyers
	var wg sync.WaitGroup
	for i, u := range users {
		wg.Go(func() {
			inst := i % len(insts)
			for range 8 {
				o := buy(&l, insts[inst].Base, u, vid)
				mu.Lock()
				answers = append(answers, answer{time.Now(), inst, o.Status})
				mu.Unlock()
				if o.Status == http.StatusOK && sold.Add(1) == stock/3 {
					g.Kill(victim)
					killed <- time.Now()
				}
				if o.Status != http.StatusServiceUnavailable && o.Status != http.StatusTooManyRequests {
					return
				}
				time.Sleep(300 * time.Millisecond)
			}
		})
		time.Sleep(step)
	}
	wg.Wait()
	var at time.Time
	select {
	case at = <-killed:
	default:
		t.Fatalf("only %d units sold: node %d was never killed", sold.Load(), victim)
	}

	// Carrying on: each instance's first 200 after the kill.
	for inst := range insts {
		var first time.Time
		var before, after, failed int
		for _, a := range answers {
			switch {
			case a.inst != inst:
			case a.status == http.StatusOK && a.at.Before(at):
				before++
			case a.status == http.StatusOK:
				after++
				if first.IsZero() || a.at.Before(first) {
					first = a.at
				}
			case a.status >= 500:
				failed++
			}
		}
		home := inst
		if allThrough {
			home = victim
		}
		t.Logf("instance %d (through node %d): %d sold before the kill, %d after, the first %v after it; %d answers 5xx",
			inst, home, before, after, first.Sub(at).Round(time.Millisecond), failed)
		if after == 0 {
			t.Errorf("instance %d sold nothing after node %d died", inst, victim)
		} else if gap := first.Sub(at); gap > galeraFailover {
			t.Errorf("instance %d sold again %v after node %d died, past the bound of %v", inst, gap.Round(time.Millisecond), victim, galeraFailover)
		}
	}

	onlyExpected(t, &l, "sold_out", "already_ordered", "unavailable", "busy")
	won := l.wins(t)
	if mode == "async" {
		waitWritten(t, db, rdb, vid, won, 30*time.Second)
	}
	// MySQL's side (in async mode the answers do not wait for it): the
	// longest stretch without a new order row, from the kill on.
	var pause time.Duration
	last, after := at, 0
	for _, r := range rose() {
		if r.After(at) {
			pause = max(pause, r.Sub(last))
			last = r
			after++
		}
	}
	if after == 0 {
		// In async mode the answers never wait for MySQL: only rows tell
		// that it carried on.
		t.Fatalf("MySQL committed no order after node %d died", victim)
	}
	t.Logf("MySQL committed no order for %v at most after the kill", pause.Round(time.Millisecond))
	if pause > galeraFailover {
		t.Errorf("MySQL committed no order for %v after node %d died, past the bound of %v", pause.Round(time.Millisecond), victim, galeraFailover)
	}
	for i, in := range insts {
		if log := in.log.String(); strings.Contains(log, "MySQL does not take writes") && !strings.Contains(log, "MySQL takes writes again") {
			t.Errorf("instance %d's consumer fell sick when node %d died and never wrote again", i, victim)
		}
	}
	s := waitSettled(t, db, rdb, vid, mode, 30*time.Second)
	checkInvariants(t, s, stock, won)
	if len(won) != stock {
		t.Errorf("%d units sold to %d buyers, want all %d", len(won), buyers, stock)
	}

	began := time.Now()
	g.Restart(t, victim)
	t.Logf("node %d rejoined in %v", victim, time.Since(began).Round(time.Millisecond))
	sameOnEveryNode(t, st, vid)
}

// watchOrders counts the voucher's orders on the node dsn names every
// 50 ms until the test ends, and returns a function that tells when the
// count rose.
func watchOrders(t *testing.T, dsn, vid string) func() []time.Time {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var rose []time.Time
	done := make(chan struct{})
	go func() {
		defer close(done)
		last := int64(0)
		for ctx.Err() == nil {
			var n int64
			if db.QueryRowContext(ctx, "SELECT COUNT(*) FROM voucher_orders WHERE voucher_id = ?", vid).Scan(&n) == nil && n > last {
				mu.Lock()
				rose = append(rose, time.Now())
				mu.Unlock()
				last = n
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		db.Close()
	})
	return func() []time.Time {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(rose)
	}
}

// The settings' side: MYSQL_NODES is a list of host:port, of MYSQL_DSN's
// cluster, over tcp.
func TestConfigMySQLNodes(t *testing.T) {
	base := map[string]string{
		"MYSQL_DSN": "root:@tcp(10.0.0.1:3306)/seckill", "REDIS_ADDR": "127.0.0.1:6379",
		"JWT_SECRET": testSecret, "PAYMENT_WEBHOOK_SECRET": testPaySecret,
	}
	for _, tc := range []struct {
		name  string
		env   map[string]string
		nodes []string
		err   string
	}{
		{"none", base, nil, ""},
		{"two more nodes", withEnv(base, "MYSQL_NODES", " 10.0.0.2:3306, 10.0.0.3:3306 "), []string{"10.0.0.2:3306", "10.0.0.3:3306"}, ""},
		{"not host:port", withEnv(base, "MYSQL_NODES", "10.0.0.2"), nil, `MYSQL_NODES: "10.0.0.2" is not host:port`},
		{"a socket DSN", withEnv(base, "MYSQL_DSN", "root:@unix(/run/mysqld/mysqld.sock)/seckill", "MYSQL_NODES", "10.0.0.2:3306"), nil, "MYSQL_NODES needs a MYSQL_DSN over tcp(host:port)"},
		{"without a DSN", withEnv(base, "MYSQL_DSN", "", "REDIS_ADDR", "", "MYSQL_NODES", "10.0.0.2:3306"), nil, "MYSQL_NODES lists more nodes of MYSQL_DSN's cluster: set MYSQL_DSN too"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := loadConfig(func(k string) string { return tc.env[k] })
			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("loadConfig: %v", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("loadConfig: %v, want an error with %q", err, tc.err)
			case tc.err == "" && !slices.Equal(c.MySQLNodes, tc.nodes):
				t.Errorf("MySQLNodes = %q, want %q", c.MySQLNodes, tc.nodes)
			}
		})
	}
}

// TestGaleraThroughput sells 2,000 units to 2,000 buyers pressing at once
// through three instances on a three-node Galera cluster: all through
// node 0 (the other nodes their failover), or each instance through its
// own node. It logs orders a second (from the first press to the last
// answer), conflicts and the group commit's mean batch. A measurement, not
// a check: it runs only when asked, without the race detector:
//
//	SECKILL_GALERA_THROUGHPUT=1 SECKILL_TEST_REDIS_ADDR=127.0.0.1:6379 \
//	  SECKILL_TEST_MYSQL_DSN='root:@tcp(127.0.0.1:3306)/seckill_ci' \
//	  go test -count=1 -run TestGaleraThroughput -v ./cmd/server
func TestGaleraThroughput(t *testing.T) {
	if os.Getenv("SECKILL_GALERA_THROUGHPUT") != "1" {
		t.Skip("a measurement: set SECKILL_GALERA_THROUGHPUT=1 to run it")
	}
	g := testenv.StartGalera(t, 3)
	// Twice each, in turn: the first sale of a process pays for what the
	// next ones find ready (connections, the ID sequence).
	for _, spread := range []bool{false, true, false, true} {
		name := "through one node"
		if spread {
			name = "each through its own node"
		}
		t.Run(name, func(t *testing.T) {
			st := newGaleraStack(t, g)
			var envs []map[string]string
			for i := range g.N() {
				home := 0
				if spread {
					home = i
				}
				envs = append(envs, st.env(t, home))
			}
			const units = 2000
			sale := pressOnce(t, startAll(t, envs), units, units)
			t.Logf("%s: %d orders in %v, %.0f orders/s; %.0f conflicts; %.1f orders a batch; 503: %d",
				name, len(sale.won), sale.took.Round(time.Millisecond), float64(len(sale.won))/sale.took.Seconds(), sale.f.conflicts, sale.f.meanBatch(),
				sale.l.count(http.StatusServiceUnavailable, "unavailable"))
		})
	}
}

// On a Galera cluster the service opens a second pool for the reads that
// decide a unit's fate (order.Config.Truth), whose reads wait for the
// cluster's commits (wsrep_sync_wait=1); on one server it opens none
// (TestAPIPanicIsInternal). It fails if openStores leaves the pool
// out on Galera, or opens it without the setting.
func galeraCausalReads(t *testing.T, g *testenv.Galera) {
	st := newGaleraStack(t, g)
	env := st.env(t, 0)
	cfg, err := loadConfig(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	stores, err := openStores(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stores.close)
	if stores.truth == nil {
		t.Fatal("no pool for causal reads on a Galera cluster")
	}
	var wait, plain int
	if err := stores.truth.Raw("SELECT @@SESSION.wsrep_sync_wait").Row().Scan(&wait); err != nil || wait != 1 {
		t.Errorf("causal reads' wsrep_sync_wait = %d (%v), want 1", wait, err)
	}
	if err := stores.db.Raw("SELECT @@SESSION.wsrep_sync_wait").Row().Scan(&plain); err != nil || plain != 0 {
		t.Errorf("the service's own reads' wsrep_sync_wait = %d (%v), want 0: every read would wait", plain, err)
	}
}
