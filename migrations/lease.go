package migrations

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/go-sql-driver/mysql"
)

// The migration lease: one row, id 1, in a table of its own, naming the
// instance that may migrate and until when (see the package's doc). Times
// are the database's (UTC_TIMESTAMP), never an instance's clock.

const (
	// leaseFor is how long a lease lasts unless renewed: how long the
	// others wait for an instance that died while migrating.
	leaseFor = 15 * time.Second
	// renewEvery: the holder renews its lease three times within
	// leaseFor, so that a late renewal or two lose nothing.
	renewEvery = leaseFor / 3
)

// errLeaseLost ends a migration whose lease another instance took.
var errLeaseLost = errors.New("migrations: lost the migration lease to another instance (not renewed within " + leaseFor.String() + ", as happens while a DDL holds every commit of a Galera cluster)")

const createLease = `CREATE TABLE IF NOT EXISTS schema_migrations_lease (
	id       INT         NOT NULL PRIMARY KEY,
	holder   VARCHAR(64) NOT NULL,
	expires  DATETIME(3) NOT NULL,
	renewals BIGINT      NOT NULL DEFAULT 0
) ENGINE = InnoDB`

// claim takes the lease if it is free or expired (or ours already). Two
// instances claiming it at once on one server are ordered by the row's
// lock; on two Galera nodes both may write it, and certification commits
// only the first: the second gets error 1213, or, retried by the node,
// finds the row taken.
const claim = `INSERT INTO schema_migrations_lease (id, holder, expires) VALUES (1, ?, UTC_TIMESTAMP(3) + INTERVAL ? SECOND)
	ON DUPLICATE KEY UPDATE
	holder = IF(holder = VALUES(holder) OR expires < UTC_TIMESTAMP(3), VALUES(holder), holder),
	expires = IF(holder = VALUES(holder), VALUES(expires), expires)`

// renew extends the lease if it is still ours. renewals changes with
// every renewal, so that a row renewed twice in one millisecond is still
// a changed row: one row affected means the lease is ours.
const renew = `UPDATE schema_migrations_lease SET expires = UTC_TIMESTAMP(3) + INTERVAL ? SECOND, renewals = renewals + 1
	WHERE id = 1 AND holder = ?`

// lease is a lease held, and renewed in the background until release.
type lease struct {
	holder string
	db     *sql.DB
	// ctx ends when the lease is lost or released: the migration runs
	// under it.
	ctx     context.Context
	cancel  context.CancelCauseFunc
	renewed chan struct{} // closed when the renewals have stopped
}

// takeLease creates the lease's table if need be, and takes the lease on
// conn, waiting up to lockWait for another instance to release it or for
// its lease to expire. It renews it on connections of db's.
func takeLease(ctx context.Context, conn *sql.Conn, db *sql.DB) (*lease, error) {
	if _, err := conn.ExecContext(ctx, createLease); err != nil {
		return nil, fmt.Errorf("migrations: create schema_migrations_lease: %w", err)
	}
	b := make([]byte, 16)
	rand.Read(b)
	holder := hex.EncodeToString(b)
	deadline := time.Now().Add(lockWait)
	for {
		got, err := tryLease(ctx, conn, holder)
		switch {
		case err != nil && !conflict(err):
			return nil, fmt.Errorf("migrations: take the lease: %w", err)
		case got:
			l := &lease{holder: holder, db: db, renewed: make(chan struct{})}
			l.ctx, l.cancel = context.WithCancelCause(ctx)
			go l.renewals()
			return l, nil
		case time.Now().After(deadline):
			return nil, fmt.Errorf("migrations: another instance held the migration lease for %s", lockWait)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("migrations: wait for the migration lease: %w", ctx.Err())
		case <-time.After(lockRetry):
		}
	}
}

// tryLease claims the lease once, and reads whose it is.
func tryLease(ctx context.Context, conn *sql.Conn, holder string) (bool, error) {
	if _, err := conn.ExecContext(ctx, claim, holder, int(leaseFor.Seconds())); err != nil {
		return false, err
	}
	// No row: the holder released the lease between the two statements.
	var now string
	err := conn.QueryRowContext(ctx, "SELECT holder FROM schema_migrations_lease WHERE id = 1").Scan(&now)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil && now == holder, err
}

// conflict reports whether err is MySQL's error 1213: the statement's
// transaction lost to another one (on Galera, to another node's) and was
// rolled back.
func conflict(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1213
}

// renewals renews the lease every renewEvery until it is released, or
// found lost: then the migration's context ends.
//
// A renewal that fails does not end it. On Galera a DDL runs in total
// order: every other commit of the cluster, the renewal's too, waits until
// it is done, which on a big table may be minutes. Cancelling the
// migration then would only drop its connection (the ALTER goes on in the
// server) and fail the start of every instance in turn. The lease may
// expire meanwhile and another instance take it; what keeps them from
// both recording a version is record's check, in the transaction that
// records it, that the lease is still ours; and every file's statements
// may run twice (see step.run).
func (l *lease) renewals() {
	defer close(l.renewed)
	t := time.NewTicker(renewEvery)
	defer t.Stop()
	for {
		select {
		case <-l.ctx.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(l.ctx, renewEvery)
		ours, err := l.renew(ctx, l.db)
		cancel()
		if err == nil && !ours {
			l.cancel(errLeaseLost)
			return
		}
	}
}

// execer is what *sql.DB and *sql.Tx both offer.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// renew extends the lease, and reports whether it is still ours.
func (l *lease) renew(ctx context.Context, q execer) (bool, error) {
	res, err := q.ExecContext(ctx, renew, int(leaseFor.Seconds()), l.holder)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// record records that s was applied, in one transaction with a renewal
// of the lease: only while the lease is ours. An instance that lost it
// (renewals blocked past leaseFor) must not record what the new holder
// may be applying too; on Galera, the two writes of the lease's row
// cannot both commit.
func (l *lease) record(ctx context.Context, conn *sql.Conn, s step) error {
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migrations: record %s: %w", s.name, err)
	}
	defer tx.Rollback()
	ours, err := l.renew(ctx, tx)
	if err == nil && !ours {
		err = errLeaseLost
	}
	if err == nil {
		_, err = tx.ExecContext(ctx, "INSERT INTO schema_migrations (version, name) VALUES (?, ?)", s.version, s.name)
	}
	if err == nil {
		err = tx.Commit()
	}
	if err != nil {
		return fmt.Errorf("migrations: record %s: %w", s.name, err)
	}
	return nil
}

// release stops the renewals and gives the lease up, so that the next
// instance need not wait for it to expire.
func (l *lease) release(ctx context.Context) {
	l.cancel(nil)
	<-l.renewed
	ctx, cancel := context.WithTimeout(ctx, renewEvery)
	defer cancel()
	// If this fails, the lease expires within leaseFor.
	l.db.ExecContext(ctx, "DELETE FROM schema_migrations_lease WHERE id = 1 AND holder = ?", l.holder)
}
