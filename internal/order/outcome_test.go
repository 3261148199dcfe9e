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
// MySQL, or MySQL answered it with an error; a lost answer is Unknown.
func TestCommitOutcome(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want Outcome
	}{
		{&mysql.MySQLError{Number: 1180, Message: "got error during COMMIT"}, NotWritten},
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
