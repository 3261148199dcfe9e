package testenv

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Galera is a MariaDB Galera cluster of the test's own: n mariadbd
// processes on this machine, each with its own data directory and ports,
// replicating every write to the others through the Galera library that
// Debian's mariadb-server depends on (galera-4). A write commits on one
// node only once the cluster has certified it: two nodes changing the same
// row at once cannot both commit, and the loser gets error 1213.
//
// Kill one node (SIGKILL) and the others go on as a cluster of n-1 once
// they have declared it gone (GaleraSuspect); Restart brings it back, and
// it catches up by IST (the writes it missed, from another node's cache) or
// SST (a copy of another node's data, by rsync). Its methods are safe to
// call from any goroutine.
type Galera struct {
	nodes []*galeraNode
}

// GaleraSuspect is how long the cluster waits for a node that went silent
// before it declares it gone (evs.suspect_timeout; Galera's default is
// 5s). Until then no node commits anything: every COMMIT waits for the
// dead node's share of the group's agreement. Writes stop for about this
// long plus a second and a half, the new view's install: 3.5 s here, about
// 6.5 s with the default (issue 23 measured 6 s). Short here so that a test
// of a node's death is quick, long enough that a node starved of CPU on a
// loaded machine for a moment is not thrown out.
const GaleraSuspect = 2 * time.Second

// galeraTimeout bounds a node's start. A joiner's state transfer (rsync
// SST) takes about five seconds on an idle machine, and joiners take
// turns at the donor.
const galeraTimeout = 90 * time.Second

// galeraNode is one mariadbd of the cluster.
type galeraNode struct {
	bin  string
	dir  string
	args []string // the node's command line, but for --wsrep-new-cluster
	port int      // SQL

	mu   sync.Mutex
	proc *process
}

// StartGalera starts an n-node Galera cluster (n is 3 for a cluster that
// survives the loss of one node: the others still hold a majority), and
// kills it when the test ends. The first node makes the cluster
// (--wsrep-new-cluster); the others join it, each receiving a copy of its
// data by rsync. It returns once every node is Synced. It is an
// integration test: skipped unless Enabled, and without mariadbd,
// mariadb-install-db, rsync or the Galera library skipped, or failed when
// SECKILL_REQUIRE_INTEGRATION=1.
func StartGalera(t testing.TB, n int) *Galera {
	t.Helper()
	Integration(t, fmt.Sprintf("a Galera cluster of %d mariadbd", n))
	bin := lookPath(t, "mariadbd")
	installDB := lookPath(t, "mariadb-install-db")
	lookPath(t, "rsync") // the state transfer
	const provider = "/usr/lib/galera/libgalera_smm.so"
	if _, err := os.Stat(provider); err != nil {
		unavailable(t, provider+" is missing (Debian's galera-4)")
	}
	start := time.Now()

	// As root, mariadbd runs as the mysql user. The joiner's state
	// transfer starts an rsync daemon, which, started by root, drops to
	// "nobody" and could not write the data directory.
	var owner *user.User
	var runAs []string
	if os.Geteuid() == 0 {
		u, err := user.Lookup("mysql")
		if err != nil {
			unavailable(t, "no mysql user to run mariadbd as (mariadb-server makes one)")
		}
		owner, runAs = u, []string{"--user=mysql"}
	}

	// Four ports a node: SQL, the group's (gcomm), IST and SST.
	ports := make([][4]int, n)
	for i := range ports {
		for j := range ports[i] {
			p, err := freePort()
			if err != nil {
				t.Fatal(err)
			}
			ports[i][j] = p
		}
	}
	var peers []string
	for _, p := range ports {
		peers = append(peers, "127.0.0.1:"+strconv.Itoa(p[1]))
	}
	g := &Galera{}
	for i, p := range ports {
		dir := tempDir(t, "seckill-galera-")
		data := filepath.Join(dir, "data")
		if err := os.Mkdir(data, 0o755); err != nil {
			t.Fatal(err)
		}
		options := strings.Join([]string{
			"gmcast.listen_addr=tcp://127.0.0.1:" + strconv.Itoa(p[1]),
			"ist.recv_addr=127.0.0.1:" + strconv.Itoa(p[2]),
			"gcache.size=32M",
			// Declare a silent node gone after GaleraSuspect (see there);
			// the other periods must not exceed it, and the inactive and
			// install timeouts must not be shorter.
			"evs.keepalive_period=PT0.5S",
			"evs.inactive_check_period=PT0.5S",
			fmt.Sprintf("evs.suspect_timeout=PT%gS", GaleraSuspect.Seconds()),
			fmt.Sprintf("evs.inactive_timeout=PT%gS", 2*GaleraSuspect.Seconds()),
			fmt.Sprintf("evs.install_timeout=PT%gS", 2*GaleraSuspect.Seconds()),
		}, ";")
		common := []string{
			"--no-defaults",
			"--datadir=" + data,
			"--tmpdir=" + dir,
			"--innodb-buffer-pool-size=32M",
			"--innodb-log-file-size=8M",
			"--innodb-use-native-aio=OFF",
			"--skip-name-resolve",
		}
		node := &galeraNode{bin: bin, dir: dir, port: p[0], args: slices.Concat(common, runAs, []string{
			"--bind-address=127.0.0.1",
			"--port=" + strconv.Itoa(p[0]),
			"--socket=" + filepath.Join(dir, "mariadb.sock"),
			"--pid-file=" + filepath.Join(dir, "mariadb.pid"),
			"--log-error=" + filepath.Join(dir, "error.log"),
			// What Galera asks of every node: row-based replication, and
			// AUTO_INCREMENT values handed out without a table lock
			// (interleaved), which certification could not order.
			"--binlog-format=ROW",
			"--innodb-autoinc-lock-mode=2",
			"--default-storage-engine=InnoDB",
			// One disk under three nodes: a commit is durable because the
			// cluster holds it, and an fsync each per COMMIT would measure
			// this machine's disk three times over. Flushed once a second.
			"--innodb-flush-log-at-trx-commit=2",
			"--wsrep-on=ON",
			"--wsrep-provider=" + provider,
			"--wsrep-cluster-name=seckill-test",
			"--wsrep-cluster-address=gcomm://" + strings.Join(peers, ","),
			"--wsrep-node-name=node" + strconv.Itoa(i),
			"--wsrep-node-address=" + peers[i],
			"--wsrep-node-incoming-address=127.0.0.1:" + strconv.Itoa(p[0]),
			"--wsrep-sst-method=rsync",
			"--wsrep-sst-receive-address=127.0.0.1:" + strconv.Itoa(p[3]),
			"--wsrep-provider-options=" + options,
		})}
		g.nodes = append(g.nodes, node)
		if owner != nil {
			chown(t, dir, owner)
		}
		if i == 0 {
			// The first node gets a fresh system database; the others get
			// all of theirs from it by state transfer.
			install := exec.Command(installDB, slices.Concat(common, runAs, []string{
				"--auth-root-authentication-method=normal", "--skip-test-db",
			})...)
			if out, err := install.CombinedOutput(); err != nil {
				t.Fatalf("mariadb-install-db: %v\n%s", err, out)
			}
		}
	}

	// Registered after the data directories' removal, so that it runs
	// before it: the nodes are killed, then their directories removed.
	t.Cleanup(g.kill)
	if err := g.nodes[0].start(true); err != nil {
		t.Fatalf("start Galera node 0: %v", err)
	}
	g.waitSynced(t, []int{0}, galeraTimeout)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := 1; i < n; i++ {
		wg.Go(func() { errs[i] = g.nodes[i].start(false) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("start Galera node %d: %v", i, err)
		}
	}
	g.WaitSynced(t)
	t.Logf("Galera cluster of %d on %s ready in %v", n, strings.Join(g.Addrs(), ", "), time.Since(start).Round(time.Millisecond))
	return g
}

// chown gives the tree at dir to u.
func chown(t testing.TB, dir string, u *user.User) {
	t.Helper()
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	err := filepath.WalkDir(dir, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, uid, gid)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// start runs the node's mariadbd and waits until it answers SQL: a joiner
// answers only once its state transfer is done.
func (n *galeraNode) start(bootstrap bool) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	args := n.args
	if bootstrap {
		args = append(slices.Clone(args), "--wsrep-new-cluster")
	}
	proc, err := startProcess(filepath.Join(n.dir, "error.log"), n.bin, args...)
	if err != nil {
		return err
	}
	cfg := nodeConfig(n.port, "")
	cfg.Timeout = time.Second
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		proc.kill()
		return err
	}
	defer db.Close()
	err = proc.waitReadyWithin(galeraTimeout, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return db.PingContext(ctx)
	})
	if err == nil {
		n.proc = proc
	}
	return err
}

func nodeConfig(port int, db string) *mysql.Config {
	cfg := mysql.NewConfig()
	cfg.User, cfg.DBName = "root", db
	cfg.Net, cfg.Addr = "tcp", "127.0.0.1:"+strconv.Itoa(port)
	cfg.ParseTime, cfg.Loc = true, time.UTC
	return cfg
}

// N is the number of nodes.
func (g *Galera) N() int { return len(g.nodes) }

// Addr returns node i's SQL address, 127.0.0.1:port.
func (g *Galera) Addr(i int) string { return "127.0.0.1:" + strconv.Itoa(g.nodes[i].port) }

// Addrs returns every node's SQL address.
func (g *Galera) Addrs() []string {
	addrs := make([]string, len(g.nodes))
	for i := range g.nodes {
		addrs[i] = g.Addr(i)
	}
	return addrs
}

// DSN returns root's DSN for database db ("" for none) on node i, with
// parseTime=true and loc=UTC like the rest of testenv.
func (g *Galera) DSN(i int, db string) string { return nodeConfig(g.nodes[i].port, db).FormatDSN() }

// Exec runs query as root on node i, and fails the test if it fails.
func (g *Galera) Exec(t testing.TB, i int, query string, args ...any) {
	t.Helper()
	db, err := sql.Open("mysql", g.DSN(i, ""))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(context.Background(), query, args...); err != nil {
		t.Fatalf("node %d: %s: %v", i, query, err)
	}
}

// CreateUser creates database db and a user name with every privilege on
// db and none elsewhere, as the service runs in production, and returns
// that user's DSN for db on each node. Users and databases are
// replicated like any other change.
func (g *Galera) CreateUser(t testing.TB, name, db string) []string {
	t.Helper()
	if !identifier.MatchString(name) || !identifier.MatchString(db) {
		t.Fatalf("CreateUser(%q, %q): names must match %s", name, db, identifier)
	}
	b := make([]byte, 8)
	rand.Read(b)
	password := hex.EncodeToString(b)
	g.Exec(t, 0, "CREATE DATABASE IF NOT EXISTS `"+db+"`")
	g.Exec(t, 0, "CREATE USER '"+name+"'@'%' IDENTIFIED BY '"+password+"'")
	g.Exec(t, 0, "GRANT ALL PRIVILEGES ON `"+db+"`.* TO '"+name+"'@'%'")
	dsns := make([]string, len(g.nodes))
	for i, n := range g.nodes {
		cfg := nodeConfig(n.port, db)
		cfg.User, cfg.Passwd = name, password
		dsns[i] = cfg.FormatDSN()
	}
	return dsns
}

// Kill stops node i at once (SIGKILL), as a crash would. The others go on
// without it once they have declared it gone (GaleraSuspect).
func (g *Galera) Kill(i int) {
	n := g.nodes[i]
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.proc != nil {
		n.proc.kill()
		n.proc = nil
	}
}

// kill kills every node, at the end of the test.
func (g *Galera) kill() {
	for i := range g.nodes {
		g.Kill(i)
	}
}

// Restart kills node i if it runs, starts it again with its data, as a
// joiner of the cluster the others still form, and waits until every node
// is Synced. The node catches up with what it missed by IST when another
// node's write-set cache (gcache) still holds it, else by a copy (SST).
func (g *Galera) Restart(t testing.TB, i int) {
	t.Helper()
	g.Kill(i)
	if err := g.nodes[i].start(false); err != nil {
		t.Fatalf("restart Galera node %d: %v", i, err)
	}
	g.WaitSynced(t)
}

// WaitSynced waits until every running node is Synced in one cluster of
// all of them (wsrep_cluster_size), and fails the test if that takes
// longer than galeraTimeout.
func (g *Galera) WaitSynced(t testing.TB) {
	t.Helper()
	var live []int
	for i, n := range g.nodes {
		n.mu.Lock()
		if n.proc != nil {
			live = append(live, i)
		}
		n.mu.Unlock()
	}
	g.waitSynced(t, live, galeraTimeout)
}

func (g *Galera) waitSynced(t testing.TB, live []int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		var problem error
		for _, i := range live {
			state, size, err := g.State(i)
			switch {
			case err != nil:
				problem = fmt.Errorf("node %d: %w", i, err)
			case state != "Synced" || size != len(live):
				problem = fmt.Errorf("node %d is %s in a cluster of %d, want Synced in %d", i, state, size, len(live))
			}
			if problem != nil {
				break
			}
		}
		if problem == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Galera cluster not synced after %s: %v", within, problem)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// State returns node i's wsrep_local_state_comment (Synced, Joining,
// Donor/Desynced, ...) and the size of the cluster it sees.
func (g *Galera) State(i int) (state string, size int, err error) {
	cfg := nodeConfig(g.nodes[i].port, "")
	cfg.Timeout, cfg.ReadTimeout = time.Second, 2*time.Second
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return "", 0, err
	}
	defer db.Close()
	rows, err := db.Query("SHOW GLOBAL STATUS WHERE Variable_name IN ('wsrep_local_state_comment', 'wsrep_cluster_size')")
	if err != nil {
		return "", 0, err
	}
	defer rows.Close()
	for rows.Next() {
		var name, value string
		if err := rows.Scan(&name, &value); err != nil {
			return "", 0, err
		}
		switch strings.ToLower(name) {
		case "wsrep_local_state_comment":
			state = value
		case "wsrep_cluster_size":
			size, _ = strconv.Atoi(value)
		}
	}
	return state, size, rows.Err()
}
