// Package autopipe lets the Redis commands of concurrent requests share
// round trips, as group commit (internal/order/writer.go) lets their order
// rows share a MySQL transaction.
//
// Without it every command is a round trip of its own: the client writes
// it to a connection (a system call), Redis reads it (another), runs it,
// writes the reply (another), and the client reads it (another). In a
// flash sale thousands of requests a second each send the same few
// commands, and on a small machine those system calls, on both sides, cost
// more than the commands themselves. With it, the commands waiting at one
// moment go out as one pipeline: one write, one read on each side for all
// of them.
//
// How: a hook on the client takes every command, puts it in a queue the
// senders share and waits for its reply. A sender takes whatever commands
// are waiting (up to a batch) and sends them as one pipeline; a sender
// alone with one command sends it as it is. Nothing waits for company:
// under light load every command still goes out at once, alone, and
// batches form only when commands arrive faster than the senders can send
// them, which is when sharing pays. Each command keeps its own reply and
// its own error; a script in a pipeline is as atomic as a script alone
// (Redis runs each command of a pipeline whole, one after the other).
//
// Why a queue under a mutex and not a channel: putting a command in the
// queue never makes its caller wait, so a caller sleeps once, for its
// reply, where a hand-off over an unbuffered channel made it sleep twice
// whenever the senders were busy (once until a sender came back to take
// the command, once for the reply). Sleeping and waking goroutines is
// much of what the Go scheduler costs an order (BENCHMARKS.md, issue 33).
// And a sender takes the whole queue at once, one lock for a batch. A
// caller may still take its command back out of the queue, as it could
// give up on a channel send, until a sender has taken it (see ProcessHook).
//
// What it changes when things fail: a connection that breaks fails every
// command of its batch, as it fails the one command it carries without the
// hook; the callers treat that error as they would, each for its own
// command (for the stock scripts: "did it run? ask", see package order).
// Blocking commands (XREADGROUP, BLPOP, WAIT, ...) bypass the senders,
// since one of them in a batch would hold up the rest, and so do the
// commands about a connection itself (HELLO, AUTH, SELECT, ...).
//
// Where not to use it: a client used for WATCH transactions or for a
// dedicated connection (Client.Conn): go-redis copies the client's hooks
// to those, and their commands would leave through the client's pool, not
// the connection that WATCHes. This project uses neither. And not on a
// Redis Cluster: go-redis' cluster pipelines may send a command again
// after a connection fails (see cmd/server/cluster.go), which a script
// that takes stock must never suffer; there every command goes alone.
package autopipe

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Pipeliner is the hook and its senders. Make one with Attach.
type Pipeliner struct {
	rdb *redis.Client
	max int

	// mu guards queue and closed. A command is in queue from its caller's
	// hook until a sender takes it; closed is set by Close, after which
	// nothing enters the queue (see Close for why that strands nothing).
	mu     sync.Mutex
	queue  []*call
	closed bool

	// wake holds a token when a sender may find commands in the queue: a
	// caller that makes the queue non-empty leaves one, and an idle sender
	// waits for it. Its room for one token is what lets a caller leave it
	// without waiting for a sender to take it.
	wake chan struct{}

	stop     chan struct{}
	stopOnce sync.Once
	senders  sync.WaitGroup

	batches, commands atomic.Int64
}

// A call is one command waiting for a sender.
type call struct {
	ctx   context.Context
	cmd   redis.Cmder
	next  redis.ProcessHook // to send it alone
	err   error             // what sending it alone returned
	panic any               // what panicked in the sender while sending it
	done  chan struct{}     // one value when the reply is in
}

var calls = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

// Attach adds the hook to rdb and starts senders senders (at least one),
// each of which sends up to batch commands per round trip. Close stops them.
//
// rdb must not retry (Options.MaxRetries -1): go-redis retries a pipeline
// whole, and a batch retried because of one command's error would run the
// others' commands, scripts that take stock among them, a second time.
func Attach(rdb *redis.Client, senders, batch int) (*Pipeliner, error) {
	if rdb.Options().MaxRetries > 0 {
		return nil, errors.New("autopipe: the client retries failed commands (set MaxRetries to -1): a retried batch would run other callers' commands twice")
	}
	if senders < 1 {
		// Without a sender a command in the queue would wait forever.
		return nil, errors.New("autopipe: no senders")
	}
	p := &Pipeliner{
		rdb: rdb, max: max(batch, 1),
		wake: make(chan struct{}, 1), stop: make(chan struct{}),
	}
	rdb.AddHook(p)
	for range senders {
		p.senders.Go(p.send)
	}
	return p, nil
}

// Close stops the senders; commands sent after it go alone. Call it
// before closing the client.
//
// Why no command is left in the queue with its caller waiting forever: a
// caller puts its command in only while the queue is open (it looks at
// closed under mu), and a sender leaves only when it finds the queue both
// empty and shut (under mu, in take). Once shut, nothing enters, so a
// queue found empty and shut stays empty: every command put in it was
// taken by a sender, which sends it and answers before it looks again.
// Closing stop only wakes the senders that sleep, so that they look.
func (p *Pipeliner) Close() {
	p.stopOnce.Do(func() {
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
		close(p.stop)
	})
	p.senders.Wait()
}

// Stats reports how many round trips the senders made and how many
// commands they carried.
func (p *Pipeliner) Stats() (batches, commands int64) {
	return p.batches.Load(), p.commands.Load()
}

// DialHook leaves dialing alone.
func (p *Pipeliner) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessPipelineHook leaves pipelines alone: they share a round trip
// already (and the senders' own pipelines pass here).
func (p *Pipeliner) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// ProcessHook hands each command to a sender and waits for its reply.
func (p *Pipeliner) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if alone(cmd.Name()) || !plain(cmd.Args()) {
			return next(ctx, cmd)
		}
		if err := ctx.Err(); err != nil {
			// Ended already: not sent, as go-redis would not send it (it
			// looks at ctx before it takes a connection).
			cmd.SetErr(err)
			return err
		}
		c := calls.Get().(*call)
		c.ctx, c.cmd, c.next = ctx, cmd, next
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.release()
			return next(ctx, cmd)
		}
		p.queue = append(p.queue, c)
		first := len(p.queue) == 1
		p.mu.Unlock()
		if first {
			// The queue was empty: a sender may be asleep. Otherwise a
			// token was left when it became non-empty (by its caller, or
			// by a take that left commands behind), and no sender sleeps
			// before it has taken that token and looked again.
			p.signal()
		}
		if done := ctx.Done(); done != nil {
			select {
			case <-c.done:
			case <-done:
				// ctx ended while the command waited. If no sender has
				// taken it, it was never sent: take it back and leave.
				// If one has, it may be on the wire: wait, as below.
				if p.withdraw(c) {
					c.release()
					cmd.SetErr(ctx.Err())
					return ctx.Err()
				}
				<-c.done
			}
		} else {
			<-c.done
		}
		// Once a sender has it, the command may be on the wire: its caller
		// waits for its reply even if ctx ends meanwhile, as go-redis
		// itself does (its read is bounded by ReadTimeout), so that the
		// caller never takes "gave up waiting" for "was not sent".
		err, p := c.err, c.panic
		c.release()
		if p != nil {
			// On the caller's goroutine, where its recovery (web.Recover)
			// can answer 500, as it would without the hook.
			panic(p)
		}
		return err
	}
}

// signal leaves a token in wake for a sender, unless one is there already.
func (p *Pipeliner) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// withdraw takes c back out of the queue and reports whether it was still
// there (no sender has taken it, nor will).
func (p *Pipeliner) withdraw(c *call) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, q := range p.queue {
		if q == c {
			last := len(p.queue) - 1
			copy(p.queue[i:], p.queue[i+1:])
			p.queue[last] = nil // not kept alive by the queue
			p.queue = p.queue[:last]
			return true
		}
	}
	return false
}

func (c *call) release() {
	c.ctx, c.cmd, c.next, c.err, c.panic = nil, nil, nil, nil, nil
	calls.Put(c)
}

// alone names the commands that go straight to their connection:
//   - those that may wait on the server, which would hold up a batch;
//   - those whose reply may be long (a range of a stream, the entries
//     pending or claimed, a whole set or hash, a scan): the sender reads
//     and parses every reply of its batch before the next batch goes, so
//     one of them would hold up every command behind it (with one sender,
//     the default, every command of the instance);
//   - those about the connection itself, which go-redis sends through the
//     hooks while it sets a new connection up (HELLO, AUTH, ...): they must
//     reach that connection, not a sender's, and a sender may be the one
//     waiting for that connection, so that handing them to the senders
//     could wait forever.
func alone(name string) bool {
	switch strings.ToLower(name) {
	case "xread", "xreadgroup", "blpop", "brpop", "brpoplpush", "blmove", "blmpop",
		"bzpopmin", "bzpopmax", "bzmpop", "wait", "waitaof",
		"xrange", "xrevrange", "xpending", "xclaim", "xautoclaim",
		"hgetall", "smembers", "scan", "sscan", "hscan", "zscan",
		"hello", "auth", "select", "client", "readonly", "readwrite", "reset", "quit",
		"multi", "exec", "discard", "watch", "unwatch":
		return true
	}
	return false
}

// plain reports whether every argument is of a kind go-redis writes
// without calling the caller's code. Any other (a struct with its own
// MarshalBinary, say) goes alone: if it failed to encode inside a batch,
// go-redis would fail every command of the batch, unsent, with its error.
func plain(args []any) bool {
	for _, a := range args {
		switch a.(type) {
		case string, []byte, int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64,
			float32, float64, bool, nil, time.Time, time.Duration:
		default:
			return false
		}
	}
	return true
}

// send is one sender: it takes the commands waiting, up to a batch, and
// sends them in one round trip; with none waiting, it sleeps until a
// caller leaves a token in wake, or Close comes.
func (p *Pipeliner) send() {
	batch := make([]*call, 0, p.max)
	for {
		var shut bool
		batch, shut = p.take(batch[:0])
		if len(batch) == 0 {
			if shut {
				// Empty and shut (Close): nothing will ever enter it again.
				return
			}
			select {
			case <-p.wake:
			case <-p.stop:
			}
			continue
		}
		p.batches.Add(1)
		p.commands.Add(int64(len(batch)))
		p.sendBatch(batch)
		for _, c := range batch {
			c.done <- struct{}{}
		}
	}
}

// take moves up to max commands from the head of the queue to batch, and
// reports whether Close has shut the queue. If it leaves commands behind
// it leaves a token too, so that with several senders a burst bigger than
// a batch need not wait for this one's round trip.
func (p *Pipeliner) take(batch []*call) ([]*call, bool) {
	p.mu.Lock()
	n := min(len(p.queue), p.max)
	batch = append(batch, p.queue[:n]...)
	rest := copy(p.queue, p.queue[n:])
	clear(p.queue[rest:]) // not kept alive by the queue
	p.queue = p.queue[:rest]
	shut := p.closed
	p.mu.Unlock()
	if rest > 0 {
		p.signal()
	}
	return batch, shut
}

// sendBatch sends batch, alone if it is one command, else as one pipeline,
// and leaves each command's error (or a panic of go-redis) in its call.
func (p *Pipeliner) sendBatch(batch []*call) {
	defer func() {
		if r := recover(); r != nil {
			for _, c := range batch {
				c.panic = r
			}
		}
	}()
	if len(batch) == 1 {
		// Alone, as without the hook. go-redis sets the command's error
		// from what the hooks return, so that is passed on.
		c := batch[0]
		c.err = c.next(c.ctx, c.cmd)
		return
	}
	pipe := p.rdb.Pipeline()
	for _, c := range batch {
		pipe.Process(c.ctx, c.cmd)
	}
	// The batch's context: the first command's, without its end, so that
	// a trace follows the first request and one request leaving does not
	// fail the others' commands.
	pipe.Exec(context.WithoutCancel(batch[0].ctx))
	for _, c := range batch {
		c.err = c.cmd.Err() // a pipeline sets each command's own
	}
}
