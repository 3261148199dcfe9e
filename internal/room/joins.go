package room

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
)

// Joins come in bursts: a crowd waiting for a sale presses "join" in the
// same second. Each join is a script call (join.lua), and a call costs
// Redis more for being a call (parsing it, setting the script up, the
// clock, the stock and the draw's state read again) than for the join
// itself. So joins of one voucher that arrive while a call for it is on
// its way wait for it to come back and then go together, in one call of
// up to maxJoins joiners: the first joiner's call goes at once, alone;
// batches form only when joins arrive faster than one call's round trip,
// which is when sharing pays. It is group commit (package order's
// writer) for the room, and autopipe's idea one level up: autopipe shares
// a round trip between calls; this shares the call.
//
// What it changes when things fail: a call that fails fails every join in
// it, each answered 503 as a failed call of its own would be; a join is
// safe to send again (join.lua answers the place already held, and
// numbers no one twice), so a lost reply costs a retry, never a place.

// maxJoins is the most joiners one call carries: a call blocks Redis while
// it runs, and 64 joins take about as long as a few dozen ordinary
// commands.
const maxJoins = 64

// joins gathers the joins of each voucher waiting for a call.
type joins struct {
	mu    sync.Mutex
	lines map[int64]*pending // by voucher: joins waiting while a call is out
}

// pending is one voucher's joins waiting for the call on its way.
type pending struct {
	calls []*joinCall
}

// joinCall is one joiner, and their answer once the call that carried
// them came back.
type joinCall struct {
	user int64
	hmac string
	done chan struct{} // closed when answer is set, or when next is theirs to send

	answer []any // join.lua's answer for them
	err    error
	next   []*joinCall // when not nil: the call is theirs to send, with these joiners (them first)
}

// join runs join.lua for user in sale's room, with whatever other joins of
// the voucher are waiting when its turn comes, and returns their answer.
func (s *Store) join(ctx context.Context, sale Sale, user int64) ([]any, error) {
	c := &joinCall{user: user, hmac: Key(sale.Seed, user), done: make(chan struct{})}
	j := &s.joins
	j.mu.Lock()
	if j.lines == nil {
		j.lines = map[int64]*pending{}
	}
	if p, out := j.lines[sale.VoucherID]; out {
		// A call is on its way: wait for it, and then either for the answer
		// or to send the next call.
		p.calls = append(p.calls, c)
		j.mu.Unlock()
		select {
		case <-c.done:
		case <-ctx.Done():
			if j.leave(sale.VoucherID, c) {
				return nil, ctx.Err()
			}
			// Too late to leave: the call is already theirs to send, or
			// their answer is on its way (done is closed right after).
			<-c.done
		}
		if c.next == nil {
			return c.answer, c.err
		}
	} else {
		j.lines[sale.VoucherID] = &pending{}
		j.mu.Unlock()
		c.next = []*joinCall{c}
	}
	// This joiner sends the call, and then hands the voucher on, whatever
	// becomes of the call. Its context ends with its request; the others'
	// joins in the call must not fail with it, so the call runs under
	// Redis' own timeouts instead.
	defer j.handOn(sale.VoucherID)
	s.send(context.WithoutCancel(ctx), sale, c.next)
	return c.answer, c.err
}

// handOn hands voucherID's joins on once a call came back: those that
// arrived meanwhile go next, sent by the first of them; or nothing is out
// any more.
func (j *joins) handOn(voucherID int64) {
	j.mu.Lock()
	p := j.lines[voucherID]
	if len(p.calls) == 0 {
		delete(j.lines, voucherID)
		j.mu.Unlock()
		return
	}
	n := min(len(p.calls), maxJoins)
	next := p.calls[:n:n]
	p.calls = p.calls[n:]
	j.mu.Unlock()
	next[0].next = next
	close(next[0].done)
}

// send runs one call of join.lua for calls, and gives each its answer
// (closing done for all but the sender, calls[0], who is not waiting).
func (s *Store) send(ctx context.Context, sale Sale, calls []*joinCall) {
	args := make([]any, 0, 3+2*len(calls))
	args = append(args, sale.OpensAt.UnixMilli(), sale.Begin.UnixMilli(), sale.End.UnixMilli())
	for _, c := range calls {
		args = append(args, strconv.FormatInt(c.user, 10), c.hmac)
	}
	v, err := joinScript.Run(ctx, s.rdb, keysOf(sale.VoucherID), args...).Slice()
	if err == nil && len(v) != len(calls) {
		err = fmt.Errorf("%d answers for %d joins", len(v), len(calls))
	}
	for i, c := range calls {
		c.err = err
		if err == nil {
			if c.answer, _ = v[i].([]any); len(c.answer) == 0 {
				c.err = errors.New("an empty answer")
			}
		}
		if i > 0 {
			close(c.done)
		}
	}
}

// leave takes c out of voucherID's waiting joins, if no call has taken it
// yet, and reports whether it did. A joiner that gives up waiting must
// leave: the next call could fall to it to send, and no one would.
func (j *joins) leave(voucherID int64, c *joinCall) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	p := j.lines[voucherID]
	if p == nil {
		return false
	}
	i := slices.Index(p.calls, c)
	if i < 0 {
		return false
	}
	p.calls = slices.Delete(p.calls, i, i+1)
	return true
}
