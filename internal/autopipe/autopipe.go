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
// How: a hook on the client takes every command, hands it to one of a few
// senders and waits for its reply. A sender takes whatever commands are
// waiting (up to a batch) and sends them as one pipeline; a sender alone
// with one command sends it as it is. Nothing waits for company: under
// light load every command still goes out at once, alone, and batches form
// only when commands arrive faster than the senders can send them, which
// is when sharing pays. Each command keeps its own reply and its own error;
// a script in a pipeline is as atomic as a script alone (Redis runs each
// command of a pipeline whole, one after the other).
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
	rdb   *redis.Client
	calls chan *call
	max   int

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

// Attach adds the hook to rdb and starts senders senders, each of which
// sends up to max commands per round trip. Close stops them.
//
// rdb must not retry (Options.MaxRetries -1): go-redis retries a pipeline
// whole, and a batch retried because of one command's error would run the
// others' commands, scripts that take stock among them, a second time.
func Attach(rdb *redis.Client, senders, max int) (*Pipeliner, error) {
	if rdb.Options().MaxRetries > 0 {
		return nil, errors.New("autopipe: the client retries failed commands (set MaxRetries to -1): a retried batch would run other callers' commands twice")
	}
	p := &Pipeliner{rdb: rdb, calls: make(chan *call), max: max, stop: make(chan struct{})}
	rdb.AddHook(p)
	for range senders {
		p.senders.Go(p.send)
	}
	return p, nil
}

// Close stops the senders; commands sent after it go alone. Call it
// before closing the client.
func (p *Pipeliner) Close() {
	p.stopOnce.Do(func() { close(p.stop) })
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
		c := calls.Get().(*call)
		c.ctx, c.cmd, c.next = ctx, cmd, next
		select {
		case p.calls <- c:
		case <-p.stop:
			c.release()
			return next(ctx, cmd)
		case <-ctx.Done():
			c.release()
			cmd.SetErr(ctx.Err())
			return ctx.Err()
		}
		// Once a sender has it, the command may be on the wire: wait for
		// its reply even if ctx ends meanwhile, as go-redis itself does
		// (its read is bounded by ReadTimeout), so that the caller never
		// takes "gave up waiting" for "was not sent".
		<-c.done
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

// send is one sender: it takes a command, whatever others are waiting
// behind it, and sends them in one round trip.
func (p *Pipeliner) send() {
	batch := make([]*call, 0, p.max)
	for {
		select {
		case c := <-p.calls:
			batch = append(batch[:0], c)
		case <-p.stop:
			return
		}
	gather:
		for len(batch) < p.max {
			select {
			case c := <-p.calls:
				batch = append(batch, c)
			default:
				break gather
			}
		}
		p.batches.Add(1)
		p.commands.Add(int64(len(batch)))
		p.sendBatch(batch)
		for _, c := range batch {
			c.done <- struct{}{}
		}
	}
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
