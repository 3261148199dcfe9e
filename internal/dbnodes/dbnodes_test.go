package dbnodes

import (
	"context"
	"database/sql"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"seckill/internal/testenv"
)

func TestMain(m *testing.M) {
	// The probes' goroutines end with Close: none may be left.
	testenv.Main(m)
}

func TestReady(t *testing.T) {
	galera := func(state, ready, cluster string) map[string]string {
		return map[string]string{"wsrep_provider_name": "Galera", "wsrep_local_state_comment": state, "wsrep_ready": ready, "wsrep_cluster_status": cluster}
	}
	for _, tc := range []struct {
		name    string
		status  map[string]string
		up, cut bool
	}{
		{"MySQL: no wsrep status", map[string]string{}, true, false},
		{"MariaDB without Galera", map[string]string{"wsrep_provider_name": "", "wsrep_ready": "OFF", "wsrep_cluster_status": "Disconnected"}, true, false},
		{"Galera node synced in the primary component", galera("Synced", "ON", "Primary"), true, false},
		{"joining (IST, SST)", galera("Joining", "OFF", "Primary"), false, true},
		{"joined, catching up", galera("Joined", "OFF", "Primary"), false, true},
		{"donor of a copy: no new connections, the open ones left", galera("Donor/Desynced", "ON", "Primary"), false, false},
		{"a donor done, catching up: the same", galera("Joined", "ON", "Primary"), false, false},
		{"cut off from the majority", galera("Synced", "OFF", "non-Primary"), false, true},
		{"initialised, not yet joined", galera("Initialized", "OFF", "Disconnected"), false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up, cut, err := ready(tc.status)
			if up != tc.up || cut != tc.cut || (err == nil) != up {
				t.Errorf("ready(%v) = %v, %v, %v; want up %v, cut %v", tc.status, up, cut, err, tc.up, tc.cut)
			}
		})
	}
}

// portOf returns the port of the server db's next statement reaches.
func portOf(t *testing.T, db *sql.DB) (int, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var port int
	err := db.QueryRowContext(ctx, "SELECT @@port").Scan(&port)
	return port, err
}

// A pool through two nodes: the preferred one dies, and the next
// statement runs on the other, on a connection dialled there at once; the
// preferred one comes back, and new connections go to it again.
func TestFailoverAndBack(t *testing.T) {
	shared, err := mysql.ParseDSN(os.Getenv("SECKILL_TEST_MYSQL_DSN"))
	if err != nil || shared.Net != "tcp" {
		t.Skip("SECKILL_TEST_MYSQL_DSN over tcp is the second node")
	}
	shared.DBName = "" // the shared server's, without touching its databases
	preferred := testenv.StartMariaDB(t)
	cfg, err := mysql.ParseDSN(preferred.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := Open(cfg, []string{shared.Addr}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nodes.Close)
	db, err := sql.Open("mysql", nodes.Config().FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })

	first, err := portOf(t, db)
	if err != nil {
		t.Fatal(err)
	}
	sharedPort := portOf2(t, shared)
	if first == sharedPort {
		t.Fatalf("the first connection went to the second node (port %d)", first)
	}

	preferred.Kill()
	began := time.Now()
	port, err := portOf(t, db)
	if err != nil {
		t.Fatalf("the statement after the preferred node died: %v", err)
	}
	if port != sharedPort {
		t.Fatalf("after the preferred node died the statement ran on port %d, want the second node's %d", port, sharedPort)
	}
	if d := time.Since(began); d > time.Second {
		t.Errorf("the statement after the preferred node died took %v: a dead node must cost a refused dial, no more", d)
	}
	if nodes.Up()[preferred.Addr()] {
		t.Error("the dead node is still taken for up")
	}

	preferred.Restart(t)
	deadline := time.Now().Add(5 * ProbeEvery)
	for !nodes.Up()[preferred.Addr()] {
		if time.Now().After(deadline) {
			t.Fatalf("the preferred node is back, but not taken for up after %v", 5*ProbeEvery)
		}
		time.Sleep(10 * time.Millisecond)
	}
	db.SetMaxIdleConns(0) // the next statement dials anew
	if port, err := portOf(t, db); err != nil || port != first {
		t.Fatalf("once the preferred node is back, a new connection reached port %d (%v), want %d", port, err, first)
	}
}

// portOf2 is the port of the server cfg names.
func portOf2(t *testing.T, cfg *mysql.Config) int {
	t.Helper()
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	port, err := portOf(t, db)
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// Galera tells a plain MariaDB (wsrep_on OFF; on MySQL, no such variable)
// from a Galera node, and an error apart from "no": the callers treat
// them differently. (A Galera node's true is shown by the Galera tests of
// cmd/server and internal/order, whose truth pool and second look depend
// on it.)
func TestGaleraOnPlainMariaDB(t *testing.T) {
	db, err := sql.Open("mysql", testenv.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if on, err := Galera(ctx, db); on || err != nil {
		t.Errorf("Galera on a plain MariaDB: %v, %v; want false, nil", on, err)
	}
	db.Close()
	if on, err := Galera(ctx, db); on || err == nil {
		t.Errorf("Galera on a closed pool: %v, %v; want false and an error", on, err)
	}
}
