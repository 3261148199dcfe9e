package main

import "context"

// Experiment 6: SETNX, then EXPIRE, as two commands.
//
// The articles' next step gives the lock an expiry: SETNX, then EXPIRE.
// Two commands leave a moment in which the key exists without an expiry,
// and a holder that dies in that moment leaves experiment 5's eternal
// lock. The lab kills the holder exactly there. The fix is one command
// that sets the key and its expiry together: SET key token NX PX ttl.
var setnxExpire = experiment{
	name:   "setnx-expire",
	title:  "SETNX then EXPIRE, holder dies between",
	counts: "refused newcomer",
	lesson: "take the lock and its expiry in one command: SET key token NX PX ttl",
	broken: func(ctx context.Context) (outcome, error) { return deadHolder(ctx, newSETNXExpireMutex) },
	fixed:  func(ctx context.Context) (outcome, error) { return deadHolder(ctx, newPackageLock) },
}
