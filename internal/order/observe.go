package order

import "time"

// Observer is told what the seckill path does, so that someone (package
// metrics, for Prometheus) can count it. This package only reports; it
// never imports a metrics library, and a Service without an Observer
// (Config.Observer nil, as in most tests) reports to nobody.
//
// Its methods run on the request path, so they must be cheap, must not
// block, and must be safe for concurrent use.
type Observer interface {
	// Stage reports how long one stage of a seckill request took.
	Stage(stage Stage, d time.Duration)
	// UserLock reports what became of one request's per-user lock.
	UserLock(result LockResult)
	// Committed reports one transaction of sync mode's group commit
	// (writer.go) that committed n orders.
	Committed(n int)
	// Reclaimed reports a unit the sweeper took back from an abandoned hold.
	Reclaimed()
	// DriftCorrected reports that the sweeper set a voucher's Redis stock
	// to MySQL's.
	DriftCorrected()
}

// Stage names a timed step of a seckill request.
type Stage int

const (
	// StageStock is the stock script in Redis (take.lua in sync mode,
	// accept.lua in async mode): the step every request pays.
	StageStock Stage = iota
	// StageLock is obtaining the per-user lock (sync mode).
	StageLock
	// StageCommit is writing the order to MySQL, from handing it to the
	// group-commit writer to its COMMIT's answer (sync mode).
	StageCommit
	// Stages is the number of stages.
	Stages
)

// String is the stage's name, as metrics label it.
func (s Stage) String() string {
	switch s {
	case StageStock:
		return "stock"
	case StageLock:
		return "lock"
	case StageCommit:
		return "commit"
	}
	return "unknown"
}

// LockResult is what became of a request's per-user lock.
type LockResult int

const (
	// LockObtained: the request got the lock.
	LockObtained LockResult = iota
	// LockContended: another request of the same user held it, and this
	// one was told to come back (busy).
	LockContended
	// LockLost: the lock was gone before the request released it (its
	// watchdog could not renew it): the order was written, or refused,
	// without its protection to the end.
	LockLost
	// LockResults is the number of results.
	LockResults
)

// String is the result's name, as metrics label it.
func (r LockResult) String() string {
	switch r {
	case LockObtained:
		return "obtained"
	case LockContended:
		return "contended"
	case LockLost:
		return "lost"
	}
	return "unknown"
}

// nobody is the Observer of a Service that was given none.
type nobody struct{}

func (nobody) Stage(Stage, time.Duration) {}
func (nobody) UserLock(LockResult)        {}
func (nobody) Committed(int)              {}
func (nobody) Reclaimed()                 {}
func (nobody) DriftCorrected()            {}
