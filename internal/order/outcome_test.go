package order

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"gorm.io/gorm"

	"seckill/internal/testenv"
)

// A failed COMMIT is "not written" only when it cannot have reached
// MySQL, or MySQL answered that it lost a conflict; a lost answer, or
// another error (on Galera, a node cut off while committing), is Unknown.
func TestCommitOutcome(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want Outcome
	}{
		{&mysql.MySQLError{Number: 1213, Message: "Deadlock found when trying to get lock; try restarting transaction"}, NotWritten},
		{&mysql.MySQLError{Number: 1180, Message: "got error during COMMIT"}, Unknown},
		{&mysql.MySQLError{Number: 1047, Message: "WSREP has not yet prepared node for application use"}, Unknown},
		{fmt.Errorf("commit: %w", driver.ErrBadConn), NotWritten},
		{sql.ErrTxDone, NotWritten},
		{context.Canceled, NotWritten},
		{context.DeadlineExceeded, NotWritten},
		{mysql.ErrInvalidConn, Unknown},
		{io.EOF, Unknown},
		{errors.New("read tcp 127.0.0.1:3306: i/o timeout"), Unknown},
	} {
		if got := commitOutcome(tc.err); got != tc.want {
			t.Errorf("commitOutcome(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// A conflict (1213: a deadlock victim, a Galera certification failure) is
// retried; nothing else is, and none of them is the rows' own fault: a
// lock wait (1205) and a Galera node not ready (1047) are transient too.
func TestConflictIsRetriedAndTransient(t *testing.T) {
	for _, tc := range []struct {
		err      error
		conflict bool
	}{
		{fmt.Errorf("commit: %w", &mysql.MySQLError{Number: 1213, Message: "Deadlock found when trying to get lock; try restarting transaction"}), true},
		{&mysql.MySQLError{Number: 1205, Message: "Lock wait timeout exceeded"}, false},
		{&mysql.MySQLError{Number: 1047, Message: "WSREP has not yet prepared node for application use"}, false},
		{driver.ErrBadConn, false},
	} {
		if got := conflict(tc.err); got != tc.conflict {
			t.Errorf("conflict(%v) = %v, want %v", tc.err, got, tc.conflict)
		}
		if permanent(tc.err) {
			t.Errorf("permanent(%v): a write that failed so may be written later", tc.err)
		}
	}
}

// conflicts counts what retryConflicts reports.
type conflicts struct {
	nobody
	n int
}

func (c *conflicts) Conflict() { c.n++ }

func TestRetryConflicts(t *testing.T) {
	lost := &mysql.MySQLError{Number: 1213, Message: "Deadlock found when trying to get lock; try restarting transaction"}
	refused := &mysql.MySQLError{Number: 1062, Message: "Duplicate entry"}
	for _, tc := range []struct {
		name      string
		results   []error // one per try: nil is Written
		want      Outcome
		tries     int
		conflicts int
	}{
		{"written at once", []error{nil}, Written, 1, 0},
		{"written at the third try", []error{lost, lost, nil}, Written, 3, 2},
		{"refused after a conflict: not retried again", []error{lost, refused}, NotWritten, 2, 1},
		{"conflicts all along: gives up", nil, NotWritten, conflictTries, conflictTries},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obs := &conflicts{}
			tries := 0
			outcome, err := retryConflicts(context.Background(), obs, func() (Outcome, error) {
				tries++
				e := error(lost)
				if tries <= len(tc.results) {
					e = tc.results[tries-1]
				}
				if e == nil {
					return Written, nil
				}
				return NotWritten, e
			})
			if outcome != tc.want || tries != tc.tries || obs.n != tc.conflicts {
				t.Errorf("got %v (%v) after %d tries, %d conflicts counted; want %v after %d tries, %d conflicts", outcome, err, tries, obs.n, tc.want, tc.tries, tc.conflicts)
			}
			if tc.want == NotWritten && tc.results == nil && !conflict(err) {
				t.Errorf("gave up with %v, which no longer says it was a conflict", err)
			}
		})
	}
	t.Run("ends with its context", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		tries := 0
		retryConflicts(ctx, nobody{}, func() (Outcome, error) {
			tries++
			cancel()
			return NotWritten, lost
		})
		if tries != 1 {
			t.Errorf("%d tries after the context ended, want 1", tries)
		}
	})
}

// The lookup after a lost COMMIT must wait for a transaction still open
// with the order's row, and see what it became: a plain read would answer
// "no order" while the COMMIT is on its way, and the unit would be given
// back under an order that then lands.
func TestLockedLookupWaitsForAnOpenTransaction(t *testing.T) {
	dsn := testenv.MySQLDSN(t)
	db := testenv.Open(t, dsn)
	ctx := context.Background()
	vid := testenv.ID() % 1_000_000_000
	for _, commit := range []bool{true, false} {
		t.Run(fmt.Sprintf("commit=%v", commit), func(t *testing.T) {
			user, id := testenv.ID()%1_000_000, testenv.ID()
			tx := db.Begin()
			if err := tx.Exec("INSERT INTO voucher_orders (id, user_id, voucher_id, status, created_at) VALUES (?, ?, ?, 'created', NOW())", id, user, vid).Error; err != nil {
				t.Fatal(err)
			}
			const open = 300 * time.Millisecond
			go func() {
				time.Sleep(open)
				if commit {
					tx.Commit()
				} else {
					tx.Rollback()
				}
			}()
			start := time.Now()
			have, err := lockedOrders(ctx, db, vid, []int64{user})
			waited := time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			if waited < open*9/10 {
				t.Errorf("answered after %s, before the transaction ended (%s): it did not wait", waited, open)
			}
			want := int64(0)
			if commit {
				want = id
			}
			if have[user] != want {
				t.Errorf("found order %d, want %d", have[user], want)
			}
		})
	}
}

// The lookup takes no gap locks: while it waits on one user's open order,
// another buyer's INSERT into a neighbouring gap goes through at once.
func TestLockedLookupBlocksNoOtherBuyer(t *testing.T) {
	db := testenv.Open(t, testenv.MySQLDSN(t))
	ctx := context.Background()
	vid := testenv.ID() % 1_000_000_000
	tx := db.Begin()
	t.Cleanup(func() { tx.Rollback() }) // a failed check must not leave the lookup waiting
	if err := tx.Exec("INSERT INTO voucher_orders (id, user_id, voucher_id, status, created_at) VALUES (1, 50, ?, 'created', NOW())", vid).Error; err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		// User 40 has no order: under REPEATABLE READ, looking for it
		// would lock the gap before user 50's entry.
		_, err := lockedOrders(ctx, db, vid, []int64{40, 50})
		done <- err
	}()
	// Until the lookup waits on user 50's row, the INSERT below would pass
	// for the wrong reason: wait until its statement is on the server.
	for deadline := time.Now().Add(5 * time.Second); ; {
		var waiting int
		if err := db.Raw(`SELECT COUNT(*) FROM information_schema.PROCESSLIST
			WHERE DB = DATABASE() AND INFO LIKE '%LOCK IN SHARE MODE%' AND ID <> CONNECTION_ID()`).Scan(&waiting).Error; err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the lookup never reached the server")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Blocked, the INSERT would wait for the lookup, which waits for tx:
	// until innodb_lock_wait_timeout (50 s), cut here at 10 s. The bound
	// tells the two apart on a loaded machine.
	ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	start := time.Now()
	_, err := transact(ictx, db, func(tx *gorm.DB) error {
		return tx.Exec("INSERT INTO voucher_orders (id, user_id, voucher_id, status, created_at) VALUES (2, 45, ?, 'created', NOW())", vid).Error
	})
	if d := time.Since(start); err != nil || d > 5*time.Second {
		t.Fatalf("another buyer's INSERT waited %s on the lookup's locks (%v)", d, err)
	}
	tx.Rollback()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
