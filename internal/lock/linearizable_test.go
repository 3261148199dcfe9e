package lock

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// A lock is a tiny replicated object, and the way to test one is the way
// Jepsen tests databases: let many clients use it at once, record when
// each call started, when it returned and what it said, and ask whether
// some order of those calls, each taking effect at one instant between
// its start and its return, explains every answer against a plain mutex.
// If none does, some client saw something no correct lock could show: two
// holders at once, or "taken" while nobody held it. porcupine searches for
// that order, as Jepsen's Knossos does.
//
// What a call said is not always known. An Obtain that failed with a
// network error, or whose wait ran out, may have taken the lock on the
// server after all, and a Release that failed may or may not have freed
// it. Such a call is recorded as "maybe", and as still running until the
// end of the history: its effect may come at any later moment (a lost
// node removed once the connection is back). The final Obtain(Wait) of
// every key then proves that whatever such a call took was given back.

// mutexOp is one call of a history, on one key.
type mutexOp struct {
	key  string
	kind opKind
	id   int // the acquisition: an Obtain's number, which its Release names
}

type opKind int

const (
	opObtain        opKind = iota // Obtain, try-once or waiting; the output says how it went
	opMaybeObtain                 // an Obtain that may or may not have taken the lock
	opRelease                     // Release; the output says how it went
	opMaybeRelease                // a Release that failed: the lock is freed at some moment after its call
	opGiveBack                    // what a maybe-Obtain took is freed at some moment after its call
	opLose                        // the holder id learned it lost its lock
	opFailover                    // the server may have lost the lock it had
	opFailoverAsync               // ... or brought back one released on the old master
	opExpire                      // a lock brought back has expired by now
)

var opNames = [...]string{"obtain", "obtain?", "release", "release?", "give back", "lose", "failover", "failover", "expire"}

// mutexResult is what a call returned.
type mutexResult int

const (
	resOK      mutexResult = iota
	resTaken               // ErrNotAcquired
	resNotHeld             // ErrNotHeld
	resNone                // no answer to check
)

// ghost is the holder of a lock brought back by a failover: nobody knows
// it holds the lock, which ends at its ttl.
const ghost = -1

// mutexModel is a plain mutex per key: the state is its holder, an
// acquisition's id, or 0 when free. splitVotes allows a refusal while
// the lock is free: RedLock's contenders may each win a minority.
func mutexModel(splitVotes bool) porcupine.Model {
	m := porcupine.NondeterministicModel{
		Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
			byKey := map[string][]porcupine.Operation{}
			var keys []string
			for _, op := range history {
				k := op.Input.(mutexOp).key
				if _, ok := byKey[k]; !ok {
					keys = append(keys, k)
				}
				byKey[k] = append(byKey[k], op)
			}
			var out [][]porcupine.Operation
			for _, k := range keys {
				out = append(out, byKey[k])
			}
			return out
		},
		Init: func() []any { return []any{0} },
		Step: func(state, input, output any) []any {
			s, in, res := state.(int), input.(mutexOp), output.(mutexResult)
			switch in.kind {
			case opObtain:
				switch {
				case res == resOK && s == 0:
					return []any{in.id}
				case res == resTaken && (s != 0 || splitVotes):
					return []any{s}
				}
				return nil
			case opMaybeObtain:
				if s == 0 {
					return []any{0, in.id}
				}
				return []any{s}
			case opRelease:
				switch {
				case res == resOK && s == in.id:
					return []any{0}
				case res == resNotHeld && s != in.id:
					return []any{s}
				}
				return nil
			case opMaybeRelease, opGiveBack, opLose:
				if s == in.id {
					return []any{0}
				}
				return []any{s}
			case opFailover:
				return []any{s, 0}
			case opFailoverAsync:
				return []any{s, 0, ghost}
			case opExpire:
				if s == ghost {
					return []any{0}
				}
				return []any{s}
			}
			return nil
		},
		DescribeOperation: func(input, output any) string {
			in := input.(mutexOp)
			name := opNames[in.kind]
			res := [...]string{"ok", "taken", "not held", ""}[output.(mutexResult)]
			return fmt.Sprintf("%s(%s #%d) %s", name, in.key, in.id, res)
		},
	}
	return m.ToModel()
}

// history runs clients against keys and records what they saw.
type history struct {
	start time.Time
	mu    sync.Mutex
	ops   []porcupine.Operation
	ids   atomic.Int64
	done  atomic.Int64 // calls returned, for a fault to time itself
	// pending are the recorded calls still running at the end: their
	// Return is set once the history is over.
	pending []int
}

func (h *history) now() int64 { return int64(time.Since(h.start)) }

// add records a call; pending calls are given their Return at the end.
func (h *history) add(client int, in mutexOp, call, ret int64, res mutexResult, pending bool) {
	h.addUntil(client, in, call, ret, res, pending, 0)
}

// addUntil records a call whose effect may come up to ghost after it
// returns; 0 means until the end of the history.
func (h *history) addUntil(client int, in mutexOp, call, ret int64, res mutexResult, pending bool, ghost time.Duration) {
	if pending && ghost > 0 {
		ret, pending = ret+int64(ghost), false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if pending {
		h.pending = append(h.pending, len(h.ops))
	}
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: res, Return: ret})
}

// Record is for a fault: it notes that kind happened to every key
// between call and ret.
func (h *history) Record(keys []string, kind opKind, call, ret int64) {
	for _, k := range keys {
		h.add(0, mutexOp{key: k, kind: kind}, call, ret, resNone, false)
	}
}

// historyRun describes one history.
type historyRun struct {
	// lockers are the clients, one goroutine each (the same Locker may
	// appear more than once).
	lockers []Locker
	keys    []string
	ops     int           // calls of Obtain per client
	ttl     time.Duration // of every lock taken
	// healthy says no call may fail: nothing is done to the servers.
	healthy    bool
	splitVotes bool
	// pace, if set, is a pause between a client's calls, so that the
	// history lasts long enough to run before, during and after a fault.
	pace time.Duration
	// tryOnly makes every call try once: the crowd of try-once callers
	// in which each one's attempt is about to fail.
	tryOnly bool
	// ghost bounds how long after a failed call returns what it took may
	// remain on the server: the time the client needs to remove it once
	// the server answers again, or the ttl, lease or session that ends
	// it. 0 means no bound: until the end of the history.
	ghost time.Duration
	// fault, if set, runs beside the clients from the start: it may wait
	// for h.done to reach a count, break a server, and Record what it did.
	fault func(h *history)
}

// checkLinearizable runs r, then takes every key once more with Wait (it
// must succeed: nothing may be left behind), and checks the history
// against the mutex model.
func checkLinearizable(t *testing.T, r historyRun) {
	t.Helper()
	h := &history{start: time.Now()}
	ctx := context.Background()
	var faultDone chan struct{}
	if r.fault != nil {
		faultDone = make(chan struct{})
		go func() {
			defer close(faultDone)
			r.fault(h)
		}()
	}
	var failures atomic.Int64
	var wg sync.WaitGroup
	for c, l := range r.lockers {
		wg.Go(func() {
			for range r.ops {
				time.Sleep(r.pace)
				key := r.keys[rand.N(len(r.keys))]
				wait := !r.tryOnly && rand.N(2) == 0
				id := int(h.ids.Add(1))
				var opts []Option
				limit := 10 * time.Second // a try-once call must not hang
				if wait {
					opts = append(opts, Wait())
					limit = 2 * time.Second
				}
				octx, cancel := context.WithTimeout(ctx, limit)
				call := h.now()
				lk, err := l.Obtain(octx, key, r.ttl, opts...)
				ret := h.now()
				cancel()
				h.done.Add(1)
				in := mutexOp{key: key, kind: opObtain, id: id}
				switch {
				case err == nil:
					h.add(c, in, call, ret, resOK, false)
				case err == ErrNotAcquired && !wait:
					h.add(c, in, call, ret, resTaken, false)
				default:
					// Another error, a wait that ran out, or a wrapped
					// ErrNotAcquired (the lock came too late, or the
					// session ended): what happened on the server is
					// not known.
					if r.healthy && !(wait && err == context.DeadlineExceeded) {
						failures.Add(1)
						t.Errorf("client %d: Obtain(%s, wait %v): %v", c, key, wait, err)
					}
					// Whatever it took is given back (the client removes
					// it, or it expires) at some moment after the call:
					// the final Obtain below proves that moment comes.
					in.kind = opMaybeObtain
					h.addUntil(c, in, call, ret, resNone, true, r.ghost)
					in.kind = opGiveBack
					h.addUntil(c, in, call, ret, resNone, true, r.ghost)
					continue
				}
				if err != nil {
					continue
				}
				obtained := ret
				time.Sleep(time.Duration(rand.N(2000)) * time.Microsecond)
				call = h.now()
				err = lk.Release(ctx)
				ret = h.now()
				in.kind = opRelease
				switch {
				case err == nil:
					h.add(c, in, call, ret, resOK, false)
				case errors.Is(err, ErrNotHeld):
					if r.healthy {
						t.Errorf("client %d: Release(%s) of a healthy lock: %v", c, key, err)
					}
					// Lost at some moment since it was obtained.
					h.add(c, mutexOp{key: key, kind: opLose, id: id}, obtained, ret, resNone, false)
					h.add(c, in, call, ret, resNotHeld, false)
				default:
					if r.healthy {
						t.Errorf("client %d: Release(%s): %v", c, key, err)
					}
					in.kind = opMaybeRelease
					h.addUntil(c, in, call, ret, resNone, true, r.ghost)
				}
			}
		})
	}
	wg.Wait()
	if faultDone != nil {
		<-faultDone
	}
	// Every key can be taken again: whatever the calls that failed took
	// was given back, or expired with its ttl, lease or session.
	for _, key := range r.keys {
		id := int(h.ids.Add(1))
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		call := h.now()
		lk, err := r.lockers[0].Obtain(wctx, key, r.ttl, Wait())
		ret := h.now()
		cancel()
		if err != nil {
			t.Errorf("final Obtain(%s, Wait) after %v: %v: something was left behind", key, time.Duration(ret-call).Round(time.Millisecond), err)
			continue
		}
		t.Logf("final Obtain(%s, Wait) took %v", key, time.Duration(ret-call).Round(time.Millisecond))
		h.add(0, mutexOp{key: key, kind: opObtain, id: id}, call, ret, resOK, false)
		call = h.now()
		err = lk.Release(ctx)
		ret = h.now()
		if err != nil {
			t.Errorf("final Release(%s): %v", key, err)
			continue
		}
		h.add(0, mutexOp{key: key, kind: opRelease, id: id}, call, ret, resOK, false)
	}
	for _, i := range h.pending {
		h.ops[i].Return = math.MaxInt64
	}
	counts := map[string]int{}
	for _, op := range h.ops {
		in := op.Input.(mutexOp)
		switch in.kind {
		case opObtain:
			counts[[...]string{"obtained", "refused"}[op.Output.(mutexResult)]]++
		case opMaybeObtain, opMaybeRelease:
			counts["unknown"]++
		}
	}
	t.Logf("%d calls: %d obtained, %d refused, %d unknown, in %v",
		len(h.ops), counts["obtained"], counts["refused"], counts["unknown"], time.Since(h.start).Round(time.Millisecond))
	res, info := porcupine.CheckOperationsVerbose(mutexModel(r.splitVotes), h.ops, time.Minute)
	switch res {
	case porcupine.Ok:
	case porcupine.Unknown:
		t.Errorf("the linearizability check ran out of time on %d calls", len(h.ops))
	default:
		t.Errorf("the history is not linearizable against a mutex:\n%s", explain(h.ops, info))
	}
}

// explain lists, for each key whose history fails, the calls around the
// point where every order of them breaks down: the longest explainable
// prefix and what follows it.
func explain(ops []porcupine.Operation, info porcupine.LinearizationInfo) string {
	var out string
	partials := info.PartialLinearizationsOperations()
	for _, part := range partials {
		var longest []porcupine.Operation
		for _, l := range part {
			if len(l) > len(longest) {
				longest = l
			}
		}
		if len(longest) == 0 {
			continue
		}
		key := longest[0].Input.(mutexOp).key
		var all []porcupine.Operation
		for _, op := range ops {
			if op.Input.(mutexOp).key == key {
				all = append(all, op)
			}
		}
		if len(longest) == len(all) {
			continue
		}
		done := map[porcupine.Operation]bool{}
		for _, op := range longest {
			done[op] = true
		}
		sort.Slice(all, func(i, j int) bool { return all[i].Call < all[j].Call })
		last := longest[len(longest)-1]
		out += fmt.Sprintf("key %s: %d of %d calls explained; the last explained: %s; calls after it:\n", key, len(longest), len(all), describe(last))
		n := 0
		for _, op := range all {
			if !done[op] && op.Return >= last.Call && n < 12 {
				out += "  " + describe(op) + "\n"
				n++
			}
		}
	}
	return out
}

func describe(op porcupine.Operation) string {
	in := op.Input.(mutexOp)
	ret := "…"
	if op.Return != math.MaxInt64 {
		ret = time.Duration(op.Return).Round(time.Microsecond).String()
	}
	name := opNames[in.kind]
	res := [...]string{"ok", "taken", "not held", ""}[op.Output.(mutexResult)]
	return fmt.Sprintf("client %d %s #%d %s [%v, %s]", op.ClientId, name, in.id, res, time.Duration(op.Call).Round(time.Microsecond), ret)
}
