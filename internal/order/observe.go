package order

import "time"

// Observer is told what the seckill path does, so that someone (package
// metrics, for Prometheus) can count it. This package only reports; it
// never imports a metrics library, and a Service without an Observer
// (Config.Observer nil, as in most tests) reports to nobody. Stages and
// lock results are named by plain strings, the values of the metrics'
// labels, so that the observer needs nothing of this package.
//
// Its methods run on the request path, so they must be cheap, must not
// block, and must be safe for concurrent use.
type Observer interface {
	// Stage reports how long one stage of a seckill request took: one of
	// StageStock, StageLock, StageCommit, StageConfirm.
	Stage(stage string, d time.Duration)
	// UserLock reports what became of one request's per-user lock: one of
	// LockObtained, LockContended, LockLost.
	UserLock(result string)
	// Committed reports one transaction of sync mode's group commit
	// (writer.go) that committed n orders.
	Committed(n int)
	// Conflict reports a transaction of orders that lost a conflict and
	// was rolled back (MySQL's error 1213: a deadlock, or on Galera a
	// certification conflict with another node's write), to be run again
	// (retryConflicts).
	Conflict()
	// Reclaimed reports a unit the sweeper took back from an abandoned hold.
	Reclaimed()
	// Unconfirmed reports n holds of committed orders whose close in Redis
	// was not acknowledged (it failed, or did not answer in time; a lost
	// reply may have closed some): each still open stays so until the
	// sweeper finds its row and closes it, keeping the buyer, once it
	// expires.
	Unconfirmed(n int)
	// DriftCorrected reports that the sweeper set a voucher's Redis stock
	// to MySQL's.
	DriftCorrected()
	// Paid reports an order paid (an applied payment event).
	Paid()
	// Cancelled reports an order cancelled, for reason CancelByBuyer or
	// CancelTimeout.
	Cancelled(reason string)
	// Refunded reports an order refunded.
	Refunded()
	// Returned reports a unit of a cancelled or refunded order back on
	// sale in Redis.
	Returned()
}

// The timed stages of a seckill request.
const (
	// StageStock is the stock script in Redis (take.lua in sync mode,
	// accept.lua in async mode): the step every request pays.
	StageStock = "stock"
	// StageLock is obtaining the per-user lock (sync mode).
	StageLock = "lock"
	// StageCommit is writing the order to MySQL, from handing it to the
	// group-commit writer to its COMMIT's answer (sync mode).
	StageCommit = "commit"
	// StageConfirm is closing the holds of committed orders in Redis (sync
	// mode): one observation for a group commit's batch (writer.go), timed
	// from its COMMIT's answer, or one for an order written alone, around
	// its own confirm. Unlike the other stages, not one a request.
	StageConfirm = "confirm"
)

// What became of a request's per-user lock.
const (
	// LockObtained: the request got the lock.
	LockObtained = "obtained"
	// LockContended: another request of the same user held it, and this
	// one was told to come back (busy).
	LockContended = "contended"
	// LockLost: the lock was gone before the request released it (its
	// watchdog could not renew it): the order was written, or refused,
	// without its protection to the end.
	LockLost = "lost"
)

// nobody is the Observer of a Service that was given none.
type nobody struct{}

func (nobody) Stage(string, time.Duration) {}
func (nobody) UserLock(string)             {}
func (nobody) Committed(int)               {}
func (nobody) Conflict()                   {}
func (nobody) Reclaimed()                  {}
func (nobody) Unconfirmed(int)             {}
func (nobody) DriftCorrected()             {}
func (nobody) Paid()                       {}
func (nobody) Cancelled(string)            {}
func (nobody) Refunded()                   {}
func (nobody) Returned()                   {}
