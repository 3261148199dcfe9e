package main

import "context"

// Experiment 8: GET, compare, then DEL, as separate commands.
//
// The articles' answer to experiment 7 is a token: the holder stores a
// random value in the key, and before deleting reads it back (GET) to
// check that the lock is still its own. Three commands leave two gaps.
// If the holder stops after its GET has said "mine" (a GC pause, a slow
// network), the lock can expire and pass to B before the DEL arrives, and
// the DEL removes B's lock as before. The lab pauses the holder exactly
// there. The fix runs the comparison and the delete as one Lua script,
// which Redis executes with nothing in between.
var getCompareDel = experiment{
	name:   "get-compare-del",
	title:  "GET, compare, then DEL in three commands",
	counts: "overlap",
	lesson: "check and delete in one atomic step: a Lua script, not GET then DEL",
	broken: func(ctx context.Context) (outcome, error) { return overrun(ctx, newGetDelMutex) },
	fixed:  func(ctx context.Context) (outcome, error) { return overrun(ctx, newPackageLock) },
}
