// Package migrations holds the schema as numbered SQL files, one folder per
// dialect, built into the binary, and applies the ones a database lacks.
//
// Each file runs once per database; the versions applied are recorded in
// schema_migrations. On MySQL, several instances starting at once take a
// lock first, so exactly one applies and the others find the work done.
// Files hold plain statements separated by a semicolon at the end of a
// line.
//
// The lock is a lease: a row in schema_migrations_lease, naming its holder
// and until when it holds it. A named lock (GET_LOCK) is not enough: it
// lives in one server's memory, and on a Galera cluster each node has its
// own, so instances starting at once on different nodes both took it,
// both migrated, and one died recording a version the other had recorded
// (Error 1062, Duplicate entry '1' for schema_migrations; issue 23). A row
// is replicated like any write: of two nodes taking it at once, Galera's
// certification lets one commit and refuses the other (error 1213). The
// holder renews the lease while it works; one that dies leaves it to
// expire, after leaseFor, and another instance takes over. GET_LOCK('seckill.migrate.<database>') is
// still taken first: it is what instances of earlier versions take, and
// on one server it keeps a second instance from polling the row.
//
// Every statement must answer within the DSN's readTimeout, or the driver
// gives up on it and the connection: so the lock is not waited for in one
// long GET_LOCK, but tried again and again, each try answered at once.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

//go:embed mysql/*.sql sqlite/*.sql
var files embed.FS

// Dialects this package has files for.
const (
	MySQL  = "mysql"
	SQLite = "sqlite"
)

// querier is what both *sql.Conn and *sql.Tx offer.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// Apply brings db up to the newest version of dialect's schema. On MySQL
// it holds one of db's connections throughout and renews its lease on
// another: db must allow two.
func Apply(ctx context.Context, db *sql.DB, dialect string) (err error) {
	steps, err := load(dialect)
	if err != nil {
		return err
	}
	// One connection for the whole run: MySQL's named lock belongs to a
	// session, so taking it on one pooled connection and releasing it on
	// another would not work.
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("migrations: connect: %w", err)
	}
	defer conn.Close()
	record := func(ctx context.Context, s step) error {
		_, err := conn.ExecContext(ctx, "INSERT INTO schema_migrations (version, name) VALUES (?, ?)", s.version, s.name)
		if err != nil {
			return fmt.Errorf("migrations: record %s: %w", s.name, err)
		}
		return nil
	}
	if dialect == MySQL {
		if err := lock(ctx, conn); err != nil {
			return err
		}
		defer conn.ExecContext(context.WithoutCancel(ctx), "SELECT RELEASE_LOCK(CONCAT('seckill.migrate.', DATABASE()))")
		l, lerr := takeLease(ctx, conn, db)
		if lerr != nil {
			return lerr
		}
		defer l.release(context.WithoutCancel(ctx))
		// Lost while working (not renewed in time): stop, rather than run
		// statements another instance may be running too.
		ctx = l.ctx
		defer func() {
			if err != nil && errors.Is(context.Cause(ctx), errLeaseLost) {
				err = fmt.Errorf("%w (%w)", context.Cause(ctx), err)
			}
		}()
		record = func(ctx context.Context, s step) error { return l.record(ctx, conn, s) }
	}
	if _, err := conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    INT         NOT NULL PRIMARY KEY,
		name       VARCHAR(255) NOT NULL
	)`); err != nil {
		return fmt.Errorf("migrations: create schema_migrations: %w", err)
	}
	done, err := applied(ctx, conn)
	if err != nil {
		return err
	}
	for _, s := range steps {
		if done[s.version] {
			continue
		}
		if err := s.run(ctx, conn); err != nil {
			return err
		}
		if err := record(ctx, s); err != nil {
			return err
		}
	}
	return nil
}

const (
	// lockWait is how long Apply waits for another instance to finish
	// migrating before it gives up (ctx may end the wait sooner).
	lockWait = 60 * time.Second
	// lockRetry is the pause between two tries of the lock.
	lockRetry = 250 * time.Millisecond
)

// lock takes the migration lock on conn, waiting up to lockWait for
// another instance to release it.
//
// Each GET_LOCK waits 0 seconds on the server and the waiting is done
// here, between tries. A GET_LOCK that waited on the server would be a
// statement as long as its wait: the driver would give up on it after
// the DSN's readTimeout (the server sets a third of STOCK_HOLD, 1s at the
// least) and fail the start of every instance but the first.
func lock(ctx context.Context, conn *sql.Conn) error {
	deadline := time.Now().Add(lockWait)
	for {
		// Named locks are server-wide: the database's name in the lock's
		// keeps deployments sharing a server from waiting on each other.
		var got sql.NullInt64
		if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(CONCAT('seckill.migrate.', DATABASE()), 0)").Scan(&got); err != nil {
			return fmt.Errorf("migrations: take lock: %w", err)
		}
		switch {
		case !got.Valid:
			return fmt.Errorf("migrations: GET_LOCK failed")
		case got.Int64 == 1:
			return nil
		case time.Now().After(deadline):
			return fmt.Errorf("migrations: another instance held the migration lock for %s", lockWait)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("migrations: wait for the migration lock: %w", ctx.Err())
		case <-time.After(lockRetry):
		}
	}
}

type step struct {
	version int
	name    string
	sql     string
}

func load(dialect string) ([]step, error) {
	names, err := fs.Glob(files, dialect+"/*.sql")
	if err != nil || len(names) == 0 {
		return nil, fmt.Errorf("migrations: no files for dialect %q", dialect)
	}
	var steps []step
	for _, name := range names {
		base := strings.TrimPrefix(name, dialect+"/")
		v, err := strconv.Atoi(strings.SplitN(base, "_", 2)[0])
		if err != nil {
			return nil, fmt.Errorf("migrations: %s does not start with a version number", name)
		}
		b, err := files.ReadFile(name)
		if err != nil {
			return nil, err
		}
		steps = append(steps, step{version: v, name: base, sql: string(b)})
	}
	sort.Slice(steps, func(i, j int) bool { return steps[i].version < steps[j].version })
	return steps, nil
}

// Versions lists the versions db has applied, oldest first, each as
// often as schema_migrations records it (once, if all is well).
func Versions(ctx context.Context, db *sql.DB) ([]int, error) {
	rows, err := db.QueryContext(ctx, "SELECT version FROM schema_migrations ORDER BY version")
	if err != nil {
		return nil, fmt.Errorf("migrations: read applied versions: %w", err)
	}
	defer rows.Close()
	var vs []int
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		vs = append(vs, v)
	}
	return vs, rows.Err()
}

func applied(ctx context.Context, q querier) (map[int]bool, error) {
	rows, err := q.QueryContext(ctx, "SELECT version FROM schema_migrations")
	if err != nil {
		return nil, fmt.Errorf("migrations: read applied versions: %w", err)
	}
	defer rows.Close()
	done := map[int]bool{}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		done[v] = true
	}
	return done, rows.Err()
}

// run executes a file's statements; Apply then records it. MySQL commits
// DDL implicitly, so a run cut short (a process killed, a connection
// lost, the lease lost) leaves some statements applied and the file
// unrecorded, and the next run executes them again: the files use IF NOT
// EXISTS where MySQL has it, and an ALTER TABLE ... ADD that finds what it
// adds already there is skipped (alreadyAdded).
func (s step) run(ctx context.Context, q querier) error {
	for _, stmt := range Statements(s.sql) {
		if _, err := q.ExecContext(ctx, stmt); err != nil && !alreadyAdded(stmt, err) {
			return fmt.Errorf("migrations: %s: %w", s.name, err)
		}
	}
	return nil
}

// alreadyAdded reports whether err says that what an ALTER TABLE adds (a
// column, an index, a constraint) exists already. An ALTER TABLE is
// atomic, all its clauses or none, so such a statement was applied whole
// by a run that was cut short before it recorded its file.
func alreadyAdded(stmt string, err error) bool {
	var me *mysql.MySQLError
	if !strings.HasPrefix(strings.ToUpper(strings.TrimSpace(stmt)), "ALTER TABLE") || !errors.As(err, &me) {
		return false
	}
	switch me.Number {
	case 1060, // duplicate column name
		1061, // duplicate key name
		1826, // duplicate constraint name (MariaDB)
		3822: // duplicate check constraint name (MySQL)
		return true
	}
	return false
}

// Statements splits a file into statements, dropping comment lines.
func Statements(src string) []string {
	var out []string
	var cur strings.Builder
	for _, line := range strings.Split(src, "\n") {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "--") {
			continue
		}
		cur.WriteString(line)
		cur.WriteString("\n")
		if strings.HasSuffix(trimmed, ";") {
			out = append(out, strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"))
			cur.Reset()
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		out = append(out, s)
	}
	return out
}
