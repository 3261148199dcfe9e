package order

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"gorm.io/gorm"

	"seckill/internal/dbnodes"
)

// Outcome is what became of a write to MySQL. It has three values, not
// two, because of one moment: the COMMIT was sent and its answer never
// came (the connection was reset, a timeout fired, the network dropped the
// reply). The transaction may have committed or not, and no error message
// can say which. Treating that as "not written" gives back a unit whose
// order exists (an oversell); treating it as "written" answers 200 for an
// order that does not exist. So every caller must handle Unknown, and the
// only way out of it is to look.
type Outcome int

const (
	// NotWritten: MySQL did not commit the transaction. Safe to give the
	// unit back.
	NotWritten Outcome = iota
	// Written: the transaction committed.
	Written
	// Unknown: the COMMIT was sent and no answer came back. Look the order
	// up (see resolve) before giving anything back.
	Unknown
)

func (o Outcome) String() string {
	switch o {
	case NotWritten:
		return "not written"
	case Written:
		return "written"
	}
	return "unknown"
}

// transact runs fn in a transaction and tells what became of it. It is
// gorm's Transaction with the COMMIT's failure told apart from the
// statements' failures: a statement that failed leaves nothing behind
// (the transaction rolls back, or dies with its connection), but a COMMIT
// that failed may have committed.
func transact(ctx context.Context, db *gorm.DB, fn func(tx *gorm.DB) error) (Outcome, error) {
	return transactWith(ctx, db, nil, fn)
}

// transactWith is transact with options for the transaction.
func transactWith(ctx context.Context, db *gorm.DB, opts *sql.TxOptions, fn func(tx *gorm.DB) error) (Outcome, error) {
	outcome, err := transactOnce(ctx, db, opts, fn)
	if outcome == NotWritten && errors.Is(err, ErrSoldOut) && db.Dialector.Name() == "mysql" {
		return soldOutCausally(ctx, db, opts, fn, err)
	}
	return outcome, err
}

// A node a moment behind. A Galera node applies the others' commits a
// moment after the cluster certified them, and the guard of an order
// (stock >= n, an UPDATE) reads its own node's row: on a node that has
// not yet applied another node's cancel, whose unit Redis already has
// back (returnUnits runs once the cancel committed), the guard finds the
// unit missing. The order would be refused sold out, and the unit dropped
// from Redis as one it counted wrongly (settleFailure, or a dead letter
// in async mode): in MySQL, not in Redis, until the sweeper's
// reconciliation, and the next buyers told sold out meanwhile.
//
// So a sold out from the guard is asked again, on a Galera node, once it
// has applied every commit the cluster certified before the question
// (wsrep_sync_wait, as the reads of Config.Truth wait): on the same
// connection, a read that waits, then the transaction whole. A guard
// that still finds nothing is right. Only the refused pay for the wait,
// and those are rare: Redis answers sold out long before MySQL does.

// soldOutCausally runs fn again, in a new transaction, after waiting on
// its connection for the node to apply what the cluster committed before,
// when db is a Galera node; else it returns the first verdict, soldOut.
func soldOutCausally(ctx context.Context, db *gorm.DB, opts *sql.TxOptions, fn func(tx *gorm.DB) error, soldOut error) (Outcome, error) {
	if !galera(ctx, db) {
		return NotWritten, soldOut
	}
	causalAsks.Add(1)
	outcome, err := NotWritten, soldOut
	cerr := db.WithContext(ctx).Connection(func(conn *gorm.DB) error {
		if err := conn.Exec("SET STATEMENT wsrep_sync_wait = 1 FOR SELECT 1 FROM vouchers LIMIT 1").Error; err != nil {
			return err
		}
		outcome, err = transactOnce(ctx, conn, opts, fn)
		return nil
	})
	if cerr != nil {
		// Not known, so not sold out either (not wrapped: the unit is
		// given back, not dropped): MySQL could not be asked.
		return NotWritten, fmt.Errorf("ask again, causally, after %v: %w", soldOut, cerr)
	}
	return outcome, err
}

// causalAsks counts the sold outs asked again on a Galera node: a test
// that makes a node lag reads it to know its buyer took this path.
var causalAsks atomic.Int64

// galeraPools remembers, by connection pool, whether its server is a
// Galera node: asked once, not at every sold out.
var galeraPools sync.Map // *sql.DB -> bool

// galera reports whether db's server is a Galera node (wsrep_on). When
// that cannot be asked it answers false, and the sold out stands as on
// one server: a probe that failed must not turn a true sold out on a
// plain MySQL into a failure that gives back a unit MySQL does not have.
func galera(ctx context.Context, db *gorm.DB) bool {
	pool, err := db.DB()
	if err != nil {
		return false
	}
	if on, ok := galeraPools.Load(pool); ok {
		return on.(bool)
	}
	on, err := dbnodes.Galera(ctx, pool)
	if err != nil {
		return false
	}
	galeraPools.Store(pool, on)
	return on
}

// transactOnce is transactWith without a second look at a sold out.
func transactOnce(ctx context.Context, db *gorm.DB, opts *sql.TxOptions, fn func(tx *gorm.DB) error) (Outcome, error) {
	tx := db.WithContext(ctx).Begin(opts)
	if err := tx.Error; err != nil {
		return NotWritten, fmt.Errorf("begin: %w", err)
	}
	if err := fn(tx); err != nil {
		tx.Rollback() // if it fails too, the server rolls back when the connection dies
		return NotWritten, err
	}
	err := tx.Commit().Error
	if err == nil {
		return Written, nil
	}
	return commitOutcome(err), fmt.Errorf("commit: %w", err)
}

// A write that failed is asked two questions, here and nowhere else, by
// sync mode's requests and async mode's consumer alike:
//
//   - did it commit? (commitOutcome) Not written, or Unknown when the
//     COMMIT was sent and its answer lost;
//   - was the failure the rows' own? (permanent) Then writing the same
//     rows again fails the same way; otherwise MySQL could not write at
//     that moment, and the same rows may be written later.

// commitOutcome classifies a failed COMMIT.
func commitOutcome(err error) Outcome {
	var me *mysql.MySQLError
	switch {
	case errors.As(err, &me) && me.Number == 1213:
		// A conflict (a deadlock victim, a Galera certification
		// failure): rolled back whole.
		return NotWritten
	case errors.As(err, &me):
		// MySQL answered with another error. On one server that means it
		// did not commit; but a Galera node that fell out of the
		// cluster's majority while committing answers an error (1180,
		// 1047) for a write set the others may have received and
		// committed. Asking costs one read (resolve), and such errors are
		// rare: ask.
		return Unknown
	case errors.Is(err, driver.ErrBadConn), errors.Is(err, sql.ErrTxDone),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		// Never sent: the driver returns ErrBadConn only when the server
		// cannot have seen the statement, and database/sql refuses to
		// commit a transaction whose context has ended (and rolls it back).
		return NotWritten
	}
	return Unknown
}

// permanent reports whether a write that failed with err failed for what
// is in its rows: MySQL's verdict on a row itself (a duplicate key, a
// CHECK or foreign key, a value it cannot store), or a verdict of this
// package's own (sold out, already ordered, an ID collision). Everything
// else says nothing about the rows: MySQL could not be reached, did not
// answer, answered that it cannot write now (read-only during a failover,
// disk full, too many connections, shutting down, no quorum, a lock wait,
// a deadlock or a Galera certification conflict, a Galera node that is not
// Synced: 1047, "WSREP has not yet prepared node for application use"),
// or lost the answer to a COMMIT. A MySQL error number not
// known here counts as not permanent: async mode retries such a write for
// as long as it takes, which costs a log line a minute; taking it for a
// verdict would dead-letter an order that was answered 200.
func permanent(err error) bool {
	// gorm (TranslateError) replaces some MySQL errors with its own.
	if errors.Is(err, ErrSoldOut) || errors.Is(err, ErrAlreadyOrdered) || errors.Is(err, errIDCollision) ||
		errors.Is(err, gorm.ErrDuplicatedKey) || errors.Is(err, gorm.ErrForeignKeyViolated) || errors.Is(err, gorm.ErrCheckConstraintViolated) {
		return true
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		switch me.Number {
		case 1048, // column cannot be null
			1062, 1586, // duplicate entry
			1264, 1690, // out of range
			1265, 1292, 1366, // truncated or incorrect value
			1406,       // data too long
			1451, 1452, // foreign key
			3819, 4025: // CHECK constraint (MySQL, MariaDB)
			return true
		}
	}
	return false
}

// A conflict is a transaction MySQL rolled back whole, with error 1213,
// because another one wanted the same rows: on one server InnoDB's
// deadlock detector chose it as the victim; on a Galera cluster, another
// node's transaction writing the same row (the hot voucher's stock) was
// certified first, and this one is refused at COMMIT, or aborted at its
// next statement. Nothing of it was written, so running it again, whole,
// is safe: the orders' rows are as new as they were, and the guards
// (stock >= n, the unique (user_id, voucher_id)) are checked again.
//
// A lock wait timeout (1205) is not retried here: it means a lock was
// held for seconds (innodb_lock_wait_timeout, a third of the hold), not
// a race lost by milliseconds; another try would wait as long again,
// past the request's deadline. It stays transient (async mode writes
// the batch again later).

// conflictTries is how often a transaction of orders is run in all, the
// first time included, while it loses conflicts. Conflicts on one hot row
// are many but brief: with a few nodes writing it, a batch that lost
// wins one of the next tries. Each try costs a round trip or two, and the
// request's deadline (WriteTimeout) bounds them all. At 8 tries, a storm
// of an order's later writes on one voucher (TestGaleraLifecycle: 160
// cancels, refunds, payments and deadlines in a second through three
// nodes) had one in a few runs lose 8 in a row, about 0.16 s of pauses;
// 16 give it 0.56 s.
const conflictTries = 16

// conflictPause is the first pause before a conflict's retry; it doubles
// up to maxConflictPause, each pause drawn at random from its upper half
// so that the losers of one conflict do not meet again in step.
const (
	conflictPause    = 2 * time.Millisecond
	maxConflictPause = 50 * time.Millisecond
)

// conflict reports whether err is a conflict.
func conflict(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1213
}

// retryConflicts runs write, a whole transaction, until it does not lose a
// conflict, conflictTries times at most, while ctx lasts: each conflict
// is counted (obs.Conflict) and retried after a short pause. What write
// returns otherwise (written, refused, unknown, another failure) is
// returned as it is.
func retryConflicts(ctx context.Context, obs Observer, write func() (Outcome, error)) (Outcome, error) {
	pause := conflictPause
	for try := 1; ; try++ {
		outcome, err := write()
		if outcome != NotWritten || !conflict(err) {
			return outcome, err
		}
		obs.Conflict()
		if try == conflictTries {
			return outcome, fmt.Errorf("lost %d conflicts in a row: %w", try, err)
		}
		select {
		case <-ctx.Done():
			return outcome, err
		case <-time.After(pause/2 + rand.N(pause/2+1)):
		}
		pause = min(2*pause, maxConflictPause)
	}
}

// transactRetried is transactWith run again, whole, while it loses
// conflicts (retryConflicts): what an order's later life writes (a
// cancel, a refund, the expirer's batch), as the buying path's writes
// are. Only a conflict is retried, which MySQL rolled back whole; a
// COMMIT whose answer was lost (Unknown) is returned as it is, for the
// caller to look up.
func transactRetried(ctx context.Context, db *gorm.DB, obs Observer, opts *sql.TxOptions, fn func(tx *gorm.DB) error) (Outcome, error) {
	return retryConflicts(ctx, obs, func() (Outcome, error) { return transactWith(ctx, db, opts, fn) })
}

// resolve finds out whether o was committed, after a COMMIT whose answer
// was lost. The order's transaction inserted its row first, and that row
// holds a lock on the unique (user_id, voucher_id) entry until the
// transaction ends. A locking read of that entry (lockedOrders) therefore
// waits for the transaction to finish one way or the other, and then sees
// the truth: a plain read could see "no row" while the COMMIT is still on
// its way, and the order would appear after we gave its unit back.
//
// It tries until ctx ends; if MySQL cannot be asked in that time the
// outcome stays Unknown, and the unit is left under its hold for the
// Sweeper, which asks again.
func resolve(ctx context.Context, db *gorm.DB, o *Order) (Outcome, error) {
	delay := 50 * time.Millisecond
	for {
		have, err := lockedOrders(ctx, db, o.VoucherID, []int64{o.UserID})
		switch {
		case err == nil && have[o.UserID] == o.ID:
			return Written, nil
		case err == nil && have[o.UserID] != 0:
			return NotWritten, ErrAlreadyOrdered // the user's other order: impossible under the lock, but not ours
		case err == nil:
			return NotWritten, fmt.Errorf("order %d: the answer to its COMMIT was lost, and it did not commit", o.ID)
		}
		if ctx.Err() != nil {
			return Unknown, fmt.Errorf("look up order %d after a lost COMMIT: %w", o.ID, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(delay):
		}
		delay = min(2*delay, time.Second)
	}
}

// readCommitted is the options of a transaction that locks only the rows
// it reads for update or changes, and no gap around them (READ COMMITTED):
// a locking read or a batch that must not hold back other buyers'
// INSERTs. Nil on SQLite (the demo), which has no such level and one
// writer at a time.
func readCommitted(db *gorm.DB) *sql.TxOptions {
	if db.Dialector.Name() != "mysql" {
		return nil
	}
	return &sql.TxOptions{Isolation: sql.LevelReadCommitted}
}

// lockedOrders returns the IDs of the orders of voucherID that users hold,
// by user, reading with a shared lock: a row whose transaction is still
// open (its COMMIT on the way) is waited for, not taken for absent. The
// read runs in READ COMMITTED: it still waits on those rows, but takes no
// gap locks, which under REPEATABLE READ would block other buyers' INSERTs
// into the gaps around the users asked about for as long as it waits.
// On SQLite (the embedded demo) a plain read is exact: its writes never
// lose an answer.
func lockedOrders(ctx context.Context, db *gorm.DB, voucherID int64, users []int64) (map[int64]int64, error) {
	var rows []struct{ ID, UserID int64 }
	q := "SELECT id, user_id FROM voucher_orders WHERE voucher_id = ? AND user_id IN ?"
	if db.Dialector.Name() == "mysql" {
		q += " LOCK IN SHARE MODE"
	}
	_, err := transactWith(ctx, db, readCommitted(db), func(tx *gorm.DB) error { return tx.Raw(q, voucherID, users).Scan(&rows).Error })
	if err != nil {
		return nil, fmt.Errorf("look up orders of voucher %d: %w", voucherID, err)
	}
	have := make(map[int64]int64, len(rows))
	for _, r := range rows {
		have[r.UserID] = r.ID
	}
	return have, nil
}
