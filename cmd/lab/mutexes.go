package main

import (
	"context"
	"errors"
	"time"
)

// Experiments 5 to 8 take a Redis lock in the ways the articles show, one
// mistake at a time, and run each next to package lock through the same
// scenario. A redisMutex is one of those ways.
type redisMutex interface {
	// lock tries once to take the lock named key for ttl, and returns
	// errBusy if another holder has it. crash is the lab's hook: where a
	// variant calls it, the lab may kill the process, and the variant
	// then returns errCrashed at once, running nothing more.
	lock(ctx context.Context, key string, ttl time.Duration, crash func() bool) (unlockFunc, error)
}

// An unlockFunc gives the lock back. pause is the lab's hook, called
// right before the command that deletes the key.
type unlockFunc func(ctx context.Context, pause func()) error

// errCrashed is what a variant returns where the lab killed it.
var errCrashed = errors.New("the process was killed here")

// lockTTL is how long the lock experiments' locks live. The lab moves
// Redis' clock by hand, so it can be as long as in production.
const lockTTL = 10 * time.Second

// never is the crash hook of a process that stays alive.
func never() bool { return false }

// nothing is the pause hook of a process that is not held up.
func nothing() {}
