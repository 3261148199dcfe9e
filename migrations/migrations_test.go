package migrations_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/glebarez/go-sqlite" // registers the "sqlite" driver the embedded demo uses
	"github.com/go-sql-driver/mysql"  // and the "mysql" driver

	"seckill/internal/testenv"
	"seckill/migrations"
)

func TestStatements(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want []string
	}{
		{"empty", "", nil},
		{"only comments and blank lines", "-- a\n\n   -- b\n\t\n", nil},
		{"one statement", "CREATE TABLE a (id INT);", []string{"CREATE TABLE a (id INT)"}},
		{"no final semicolon", "SELECT 1", []string{"SELECT 1"}},
		{
			"several statements over several lines",
			"-- users\nCREATE TABLE a (\n    id INT\n);\n\nCREATE TABLE b (id INT);\n",
			[]string{"CREATE TABLE a (\n    id INT\n)", "CREATE TABLE b (id INT)"},
		},
		{
			"comment lines inside a statement are dropped",
			"CREATE TABLE a (\n    -- the key\n    id INT\n);",
			[]string{"CREATE TABLE a (\n    id INT\n)"},
		},
		{
			"a semicolon inside a line does not split",
			"INSERT INTO a VALUES (';x');\n",
			[]string{"INSERT INTO a VALUES (';x')"},
		},
		{"CRLF line ends", "SELECT 1;\r\nSELECT 2;\r\n", []string{"SELECT 1", "SELECT 2"}},
		{"trailing blanks after the semicolon", "SELECT 1;   \nSELECT 2", []string{"SELECT 1", "SELECT 2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := migrations.Statements(tt.src); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Statements(%q)\n got %q\nwant %q", tt.src, got, tt.want)
			}
		})
	}
}

// TestFiles checks the files themselves: both dialects have the same
// versions, and every statement is one the runner can execute.
func TestFiles(t *testing.T) {
	versions := map[string][]string{}
	for _, dialect := range []string{migrations.MySQL, migrations.SQLite} {
		names, err := filepath.Glob(filepath.Join(dialect, "*.sql"))
		if err != nil || len(names) == 0 {
			t.Fatalf("no files for %s: %v", dialect, err)
		}
		for _, name := range names {
			base := filepath.Base(name)
			versions[dialect] = append(versions[dialect], strings.SplitN(base, "_", 2)[0])
			src, err := os.ReadFile(name)
			if err != nil {
				t.Fatal(err)
			}
			stmts := migrations.Statements(string(src))
			if len(stmts) == 0 {
				t.Errorf("%s has no statements", name)
			}
			for _, s := range stmts {
				if strings.HasSuffix(s, ";") || strings.TrimSpace(s) != s {
					t.Errorf("%s: statement not trimmed: %q", name, s)
				}
				// The runner may be cut short and run a file again: every
				// CREATE must be safe to repeat.
				if up := strings.ToUpper(s); strings.HasPrefix(up, "CREATE") && !strings.Contains(up, "IF NOT EXISTS") {
					t.Errorf("%s: CREATE without IF NOT EXISTS: %q", name, s)
				}
			}
		}
	}
	if !reflect.DeepEqual(versions[migrations.MySQL], versions[migrations.SQLite]) {
		t.Errorf("versions differ: mysql %v, sqlite %v", versions[migrations.MySQL], versions[migrations.SQLite])
	}
}

// fileCount is the number of migration files of dialect.
func fileCount(t *testing.T, dialect string) int {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dialect, "*.sql"))
	if err != nil {
		t.Fatal(err)
	}
	return len(names)
}

// openSQLite returns a fresh SQLite database in a temporary file.
func openSQLite(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "seckill.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// migratedSQLite returns a fresh SQLite database with the schema applied.
func migratedSQLite(t *testing.T) *sql.DB {
	t.Helper()
	db := openSQLite(t)
	if err := migrations.Apply(context.Background(), db, migrations.SQLite); err != nil {
		t.Fatalf("apply: %v", err)
	}
	return db
}

// openMySQL opens a fresh, migrated MySQL database (see testenv.MySQLDSN).
func openMySQL(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", testenv.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func versionsApplied(t *testing.T, db *sql.DB) []int {
	t.Helper()
	vs, err := migrations.Versions(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	return vs
}

func TestApplySQLiteTwice(t *testing.T) {
	ctx := context.Background()
	db := migratedSQLite(t)
	first := versionsApplied(t, db)
	if len(first) != fileCount(t, migrations.SQLite) {
		t.Fatalf("schema_migrations holds %v, want one row per file (%d)", first, fileCount(t, migrations.SQLite))
	}
	before := sqliteSchema(t, db)
	if err := migrations.Apply(ctx, db, migrations.SQLite); err != nil {
		t.Fatalf("second apply: %v", err)
	}
	if got := versionsApplied(t, db); !reflect.DeepEqual(got, first) {
		t.Errorf("after the second apply schema_migrations holds %v, want %v", got, first)
	}
	if after := sqliteSchema(t, db); !reflect.DeepEqual(after, before) {
		t.Errorf("the second apply changed the schema:\nbefore %v\nafter  %v", before, after)
	}
}

func TestApplyUnknownDialect(t *testing.T) {
	if err := migrations.Apply(context.Background(), openSQLite(t), "oracle"); err == nil {
		t.Fatal("Apply with an unknown dialect succeeded")
	}
}

func TestApplyMySQLAgainIsNoOp(t *testing.T) {
	ctx := context.Background()
	db := openMySQL(t) // already migrated once by testenv
	first := versionsApplied(t, db)
	if len(first) != fileCount(t, migrations.MySQL) {
		t.Fatalf("schema_migrations holds %v, want one row per file (%d)", first, fileCount(t, migrations.MySQL))
	}
	before := mysqlSchema(t, db)
	for range 2 {
		if err := migrations.Apply(ctx, db, migrations.MySQL); err != nil {
			t.Fatalf("apply again: %v", err)
		}
	}
	if got := versionsApplied(t, db); !reflect.DeepEqual(got, first) {
		t.Errorf("schema_migrations holds %v, want %v", got, first)
	}
	if after := mysqlSchema(t, db); !reflect.DeepEqual(after, before) {
		t.Errorf("applying again changed the schema:\nbefore %v\nafter  %v", before, after)
	}
}

// TestApplyMySQLConcurrently starts five "instances" at once on an empty
// database, as the contract says several servers may: all must succeed,
// and each file must be applied exactly once.
func TestApplyMySQLConcurrently(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.EmptyMySQLDSN(t)

	const instances = 5
	dbs := make([]*sql.DB, instances)
	for i := range dbs {
		// A pool per goroutine: separate servers share no connections.
		var err error
		if dbs[i], err = sql.Open("mysql", dsn); err != nil {
			t.Fatal(err)
		}
		defer dbs[i].Close()
		if err := dbs[i].PingContext(ctx); err != nil {
			t.Fatal(err)
		}
	}
	errs := make([]error, instances)
	release := make(chan struct{})
	var wg sync.WaitGroup
	for i := range instances {
		wg.Go(func() {
			<-release
			errs[i] = migrations.Apply(ctx, dbs[i], migrations.MySQL)
		})
	}
	close(release)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("instance %d: %v", i, err)
		}
	}
	if got := versionsApplied(t, dbs[0]); len(got) != fileCount(t, migrations.MySQL) {
		t.Errorf("schema_migrations holds %v, want one row per file (%d)", got, fileCount(t, migrations.MySQL))
	}
	if got, want := mysqlSchema(t, dbs[0]), mysqlSchema(t, openMySQL(t)); !reflect.DeepEqual(got, want) {
		t.Errorf("concurrent apply gave another schema:\n got %v\nwant %v", got, want)
	}
}

// holdMigrationLock takes the migration lock of dsn's database on a
// connection of its own, as another instance migrating would, and returns
// a function that releases it.
func holdMigrationLock(t *testing.T, dsn string) (release func()) {
	t.Helper()
	ctx := context.Background()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got int
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(CONCAT('seckill.migrate.', DATABASE()), 0)").Scan(&got); err != nil || got != 1 {
		t.Fatalf("take the migration lock: %d, %v", got, err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			conn.ExecContext(ctx, "SELECT RELEASE_LOCK(CONCAT('seckill.migrate.', DATABASE()))")
			conn.Close()
			db.Close()
		})
	}
	t.Cleanup(release)
	return release
}

// TestApplyMySQLWaitsForTheLock: an instance finds the migration lock held
// for longer than its DSN's readTimeout, as at a start of several instances
// with a short STOCK_HOLD. It must wait and then succeed: a single GET_LOCK
// waiting on the server would outlast the readTimeout and be cut off by
// the driver.
func TestApplyMySQLWaitsForTheLock(t *testing.T) {
	dsn := testenv.MySQLDSN(t)
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ReadTimeout = time.Second
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()

	const held = 2500 * time.Millisecond
	release := holdMigrationLock(t, dsn)
	time.AfterFunc(held, release)
	began := time.Now()
	if err := migrations.Apply(context.Background(), db, migrations.MySQL); err != nil {
		t.Fatalf("apply while another held the lock for %s (readTimeout 1s): %v", held, err)
	}
	if waited := time.Since(began); waited < held-100*time.Millisecond {
		t.Errorf("apply returned after %s, before the lock held for %s was released", waited, held)
	}
}

// TestApplyMySQLWaitEndsWithContext: waiting for the lock ends when ctx
// does (SIGTERM during start-up), with ctx's error.
func TestApplyMySQLWaitEndsWithContext(t *testing.T) {
	dsn := testenv.MySQLDSN(t)
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	holdMigrationLock(t, dsn)

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	began := time.Now()
	err = migrations.Apply(ctx, db, migrations.MySQL)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("apply with the lock held and a 1s context: %v, want the context's deadline", err)
	}
	if waited := time.Since(began); waited > 3*time.Second {
		t.Errorf("apply returned %s after its context ended", waited-time.Second)
	}
}

// holdLease writes the migration lease as another instance holding it
// would, until expires seconds from now (negative: expired), with no named
// lock: as an instance on another Galera node, whose GET_LOCK this server
// never sees. It returns a function that deletes the lease.
func holdLease(t *testing.T, db *sql.DB, expires int) (release func()) {
	t.Helper()
	ctx := context.Background()
	if err := migrations.Apply(ctx, db, migrations.MySQL); err != nil { // makes the lease's table
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "REPLACE INTO schema_migrations_lease (id, holder, expires) VALUES (1, 'another node', UTC_TIMESTAMP(3) + INTERVAL ? SECOND)", expires); err != nil {
		t.Fatal(err)
	}
	return func() {
		if _, err := db.ExecContext(ctx, "DELETE FROM schema_migrations_lease WHERE holder = 'another node'"); err != nil {
			t.Error(err)
		}
	}
}

// TestApplyMySQLWaitsForTheLease: another instance holds the lease (as on
// another Galera node, where GET_LOCK excludes nobody): Apply waits until
// it is released, and only then migrates.
func TestApplyMySQLWaitsForTheLease(t *testing.T) {
	db := openMySQL(t)
	release := holdLease(t, db, 60)
	if _, err := db.Exec("DELETE FROM schema_migrations WHERE version = 1"); err != nil { // work to do
		t.Fatal(err)
	}
	const held = 1500 * time.Millisecond
	time.AfterFunc(held, release)
	began := time.Now()
	if err := migrations.Apply(context.Background(), db, migrations.MySQL); err != nil {
		t.Fatalf("apply while another instance held the lease for %s: %v", held, err)
	}
	if waited := time.Since(began); waited < held-100*time.Millisecond {
		t.Errorf("apply returned after %s, before the lease held for %s was released", waited, held)
	}
	if got := versionsApplied(t, db); len(got) != fileCount(t, migrations.MySQL) {
		t.Errorf("schema_migrations holds %v, want one row per file", got)
	}
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM schema_migrations_lease").Scan(&n); err != nil || n != 0 {
		t.Errorf("%d leases left after apply (%v), want the lease released", n, err)
	}
}

// TestApplyMySQLTakesAnExpiredLease: the holder died while migrating and
// its lease has run out: the next instance takes it at once.
func TestApplyMySQLTakesAnExpiredLease(t *testing.T) {
	db := openMySQL(t)
	holdLease(t, db, -1)
	began := time.Now()
	if err := migrations.Apply(context.Background(), db, migrations.MySQL); err != nil {
		t.Fatalf("apply with an expired lease: %v", err)
	}
	if waited := time.Since(began); waited > time.Second {
		t.Errorf("apply waited %s for a lease that had expired", waited)
	}
}

// TestApplyMySQLLeaseWaitEndsWithContext: waiting for the lease ends when
// ctx does.
func TestApplyMySQLLeaseWaitEndsWithContext(t *testing.T) {
	db := openMySQL(t)
	holdLease(t, db, 60)
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	if err := migrations.Apply(ctx, db, migrations.MySQL); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("apply with the lease held and a short context: %v, want the context's deadline", err)
	}
}

// schema is what both dialects must agree on: per table, its sorted
// column names; and per table, its unique indexes as column lists.
type schema struct {
	Columns map[string][]string
	Unique  map[string][][]string // includes the primary key
	NotNull map[string]bool       // "table.column"
}

func sqliteSchema(t *testing.T, db *sql.DB) schema {
	t.Helper()
	s := schema{Columns: map[string][]string{}, Unique: map[string][][]string{}, NotNull: map[string]bool{}}
	tables := queryStrings(t, db, "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
	for _, table := range tables {
		var pk []string
		rows, err := db.Query("SELECT name, \"notnull\", pk FROM pragma_table_info(?) ORDER BY pk", table)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var name string
			var notNull, pkPos int
			if err := rows.Scan(&name, &notNull, &pkPos); err != nil {
				t.Fatal(err)
			}
			s.Columns[table] = append(s.Columns[table], name)
			// SQLite lets a non-INTEGER primary key hold NULL; an INTEGER
			// PRIMARY KEY is the rowid and never NULL.
			if notNull == 1 || pkPos > 0 {
				s.NotNull[table+"."+name] = true
			}
			if pkPos > 0 {
				pk = append(pk, name)
			}
		}
		rows.Close()
		sort.Strings(s.Columns[table])
		if len(pk) > 0 {
			s.Unique[table] = append(s.Unique[table], pk)
		}
		for _, index := range queryStrings(t, db, "SELECT name FROM pragma_index_list(?) WHERE \"unique\" = 1 AND origin != 'pk'", table) {
			cols := queryStrings(t, db, "SELECT name FROM pragma_index_info(?) ORDER BY seqno", index)
			s.Unique[table] = append(s.Unique[table], cols)
		}
		sortIndexes(s.Unique[table])
	}
	return s
}

func mysqlSchema(t *testing.T, db *sql.DB) schema {
	t.Helper()
	s := schema{Columns: map[string][]string{}, Unique: map[string][][]string{}, NotNull: map[string]bool{}}
	// ORDER BY BINARY: byte order, as Go sorts the
	// SQLite side (the default collation sorts "_" after letters).
	// schema_migrations_lease is the runner's lock on MySQL (lease.go), a
	// table the embedded demo's single process does without.
	rows, err := db.Query(`SELECT table_name, column_name, is_nullable FROM information_schema.columns
		WHERE table_schema = DATABASE() AND table_name != 'schema_migrations_lease' ORDER BY table_name, BINARY column_name`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var table, column, nullable string
		if err := rows.Scan(&table, &column, &nullable); err != nil {
			t.Fatal(err)
		}
		s.Columns[table] = append(s.Columns[table], column)
		if nullable == "NO" {
			s.NotNull[table+"."+column] = true
		}
	}
	rows.Close()
	rows, err = db.Query(`SELECT table_name, index_name, column_name FROM information_schema.statistics
		WHERE table_schema = DATABASE() AND table_name != 'schema_migrations_lease' AND non_unique = 0 ORDER BY table_name, index_name, seq_in_index`)
	if err != nil {
		t.Fatal(err)
	}
	indexes := map[[2]string][]string{}
	for rows.Next() {
		var table, index, column string
		if err := rows.Scan(&table, &index, &column); err != nil {
			t.Fatal(err)
		}
		k := [2]string{table, index}
		indexes[k] = append(indexes[k], column)
	}
	rows.Close()
	for k, cols := range indexes {
		s.Unique[k[0]] = append(s.Unique[k[0]], cols)
	}
	for _, idx := range s.Unique {
		sortIndexes(idx)
	}
	return s
}

func sortIndexes(idx [][]string) {
	slices.SortFunc(idx, func(a, b []string) int { return strings.Compare(strings.Join(a, ","), strings.Join(b, ",")) })
}

func queryStrings(t *testing.T, db *sql.DB, query string, args ...any) []string {
	t.Helper()
	rows, err := db.Query(query, args...)
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestDialectsAgree is the check that keeps the embedded demo honest: the
// SQLite schema has the same tables, columns and unique indexes as the
// MySQL one, and both have what the contract says checks read directly.
func TestDialectsAgree(t *testing.T) {
	my := mysqlSchema(t, openMySQL(t))
	lite := sqliteSchema(t, migratedSQLite(t))

	t.Run("same tables and columns", func(t *testing.T) {
		if !reflect.DeepEqual(my.Columns, lite.Columns) {
			t.Errorf("columns differ:\nmysql  %v\nsqlite %v", my.Columns, lite.Columns)
		}
	})
	t.Run("same unique indexes", func(t *testing.T) {
		if !reflect.DeepEqual(my.Unique, lite.Unique) {
			t.Errorf("unique indexes differ:\nmysql  %v\nsqlite %v", my.Unique, lite.Unique)
		}
	})
	t.Run("same NOT NULL columns", func(t *testing.T) {
		if !reflect.DeepEqual(my.NotNull, lite.NotNull) {
			t.Errorf("NOT NULL columns differ:\nmysql  %v\nsqlite %v", my.NotNull, lite.NotNull)
		}
	})

	contract := map[string][]string{
		"users":          {"id", "phone"},
		"vouchers":       {"id", "title", "stock", "begin_time", "end_time"},
		"voucher_orders": {"id", "user_id", "voucher_id", "status", "created_at"},
	}
	notNull := []string{"vouchers.stock", "voucher_orders.user_id", "voucher_orders.voucher_id"}
	unique := map[string][][]string{
		"users":          {{"id"}, {"phone"}},
		"vouchers":       {{"id"}},
		"voucher_orders": {{"id"}, {"user_id", "voucher_id"}},
	}
	for dialect, s := range map[string]schema{migrations.MySQL: my, migrations.SQLite: lite} {
		t.Run(dialect+" has the contract's schema", func(t *testing.T) {
			for table, cols := range contract {
				for _, c := range cols {
					if !slices.Contains(s.Columns[table], c) {
						t.Errorf("%s.%s is missing (table has %v)", table, c, s.Columns[table])
					}
				}
			}
			for _, c := range notNull {
				if !s.NotNull[c] {
					t.Errorf("%s may be NULL", c)
				}
			}
			for table, idxs := range unique {
				for _, want := range idxs {
					if !slices.ContainsFunc(s.Unique[table], func(got []string) bool { return slices.Equal(got, want) }) {
						t.Errorf("%s has no unique index on (%s); it has %v", table, strings.Join(want, ", "), s.Unique[table])
					}
				}
			}
		})
	}

	// The contract also names MySQL types.
	t.Run("mysql column types", func(t *testing.T) {
		db := openMySQL(t)
		want := map[string]string{
			"users.id": "bigint", "users.phone": "varchar",
			"vouchers.id": "bigint", "vouchers.stock": "int",
			"vouchers.begin_time": "datetime", "vouchers.end_time": "datetime",
			"voucher_orders.id": "bigint", "voucher_orders.user_id": "bigint", "voucher_orders.voucher_id": "bigint",
		}
		for col, typ := range want {
			table, column, _ := strings.Cut(col, ".")
			var got string
			err := db.QueryRow(`SELECT data_type FROM information_schema.columns
				WHERE table_schema = DATABASE() AND table_name = ? AND column_name = ?`, table, column).Scan(&got)
			if err != nil {
				t.Errorf("%s: %v", col, err)
				continue
			}
			if !strings.EqualFold(got, typ) {
				t.Errorf("%s is %s, want %s", col, got, typ)
			}
		}
	})
}

// TestSchemaGuards checks the last guards the order flow relies on, in
// both dialects: one order per user and voucher, and no negative stock.
func TestSchemaGuards(t *testing.T) {
	open := map[string]func(*testing.T) *sql.DB{migrations.SQLite: migratedSQLite, migrations.MySQL: openMySQL}
	for _, dialect := range []string{migrations.SQLite, migrations.MySQL} {
		t.Run(dialect, func(t *testing.T) {
			ctx := context.Background()
			db := open[dialect](t)
			exec := func(q string, args ...any) error {
				_, err := db.ExecContext(ctx, q, args...)
				return err
			}
			if err := exec(`INSERT INTO vouchers (id, title, stock, initial_stock, begin_time, end_time, created_at)
				VALUES (1, 't', 1, 1, '2024-01-01 00:00:00', '2024-01-02 00:00:00', '2024-01-01 00:00:00')`); err != nil {
				t.Fatal(err)
			}
			if err := exec("UPDATE vouchers SET stock = -1 WHERE id = 1"); err == nil {
				t.Error("stock -1 was stored")
			}
			ins := "INSERT INTO voucher_orders (id, user_id, voucher_id, status, created_at) VALUES (?, 7, 1, 'created', '2024-01-01 00:00:00')"
			if err := exec(ins, 100); err != nil {
				t.Fatal(err)
			}
			if err := exec(ins, 101); err == nil {
				t.Error("a second order of user 7 for voucher 1 was stored")
			}
			if err := exec(`INSERT INTO users (phone, created_at) VALUES ('13800000000', '2024-01-01 00:00:00')`); err != nil {
				t.Fatal(err)
			}
			if err := exec(`INSERT INTO users (phone, created_at) VALUES ('13800000000', '2024-01-01 00:00:00')`); err == nil {
				t.Error("a phone was stored twice")
			}
		})
	}
}
