package queue

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// This file is the consumer's write (see consumer.go): a batch read from
// the stream goes to MySQL through the Writer, and what was settled is
// acknowledged; an entry MySQL refuses for good goes to the dead letters
// (deadletters.go).

var (
	//go:embed ack.lua
	ackSrc    string
	ackScript = redis.NewScript(ackSrc)
)

// handle writes a batch and acknowledges what was settled: written, found
// already written, or sent to the dead letters. An entry that could not be
// written for a reason that is not its own stays pending, and handle
// returns that reason: the caller's consumer is sick (see Consumer).
// again says the entries were delivered before (not read as new): a dead
// letter of theirs may have been begun, and is then finished instead.
func (p *Consumer) handle(ctx context.Context, msgs []redis.XMessage, again bool) error {
	// A batch once read is finished even if shutdown begins meanwhile (ctx
	// is the drain's, which ends only when SHUTDOWN_GRACE runs out), and
	// it must end well before another consumer may claim its entries.
	ctx, cancel := context.WithTimeout(ctx, p.cfg.ClaimIdle/2)
	defer cancel()
	deadline, _ := ctx.Deadline()
	var msgsOK []redis.XMessage
	var entries []Entry
	for _, m := range msgs {
		e, err := p.parse(m)
		if err != nil {
			p.deadLetter(ctx, m, err, false, false) // cannot ever succeed: do not retry
			continue
		}
		msgsOK = append(msgsOK, m)
		entries = append(entries, e)
	}
	if again && len(entries) > 0 {
		var err error
		if msgsOK, entries, err = p.finishDeadLetters(ctx, msgsOK, entries); err != nil {
			p.log.Warn("read the marks of dead letters begun; the batch stays pending and is read again", "err", err)
			return nil
		}
	}
	if len(entries) == 0 {
		return nil
	}
	verdict, err := p.w.Write(ctx, entries)
	if verdict == Written {
		p.cfg.OnBatch(len(entries))
		p.size = min(2*p.size, p.cfg.Batch)
		p.ack(ctx, msgsOK, entries)
		return nil
	}
	if errors.Is(err, context.DeadlineExceeded) && len(entries) > 1 {
		// Too big to write in its time: smaller batches next, or the
		// same batch would run out of time forever.
		p.size = max(len(entries)/2, 1)
	}
	if verdict == Later {
		// MySQL is away, read-only, full, or lost the COMMIT's answer
		// (the next attempt finds the rows if it committed). Writing the
		// entries one by one would fail the same way.
		return err
	}
	// MySQL refused the batch because of what is in it. Write its entries
	// one by one, so that one bad entry cannot hold the others back.
	p.log.Warn("batch refused; writing its entries one by one", "size", len(entries), "err", err)
	for i, e := range entries {
		if time.Now().After(deadline) {
			return nil // the rest stay pending for the next attempt
		}
		verdict, err := p.w.Write(ctx, []Entry{e})
		switch {
		case verdict == Written:
			p.cfg.OnBatch(1)
			p.ack(ctx, msgsOK[i:i+1], entries[i:i+1])
		case verdict == Later:
			return err
		case verdict == NoStock, verdict == HasOrder, verdict == IDTaken:
			// MySQL refuses it for good: retrying cannot help.
			p.deadLetter(ctx, msgsOK[i], err, verdict == NoStock, verdict == HasOrder)
		case p.deliveries(ctx, msgsOK[i].ID) >= p.cfg.MaxDeliveries:
			p.deadLetter(ctx, msgsOK[i], err, false, false) // MySQL refused this entry, again and again
		}
		// Otherwise left pending: catchUp delivers it again, and counts.
	}
	return nil
}

// ack acknowledges written entries, forgets their pending markers, and
// counts them off their vouchers' queues (ack.lua), in one round trip.
func (p *Consumer) ack(ctx context.Context, msgs []redis.XMessage, entries []Entry) {
	keys := []string{p.stream, p.pending}
	args := []any{GroupName}
	for i, m := range msgs {
		keys = append(keys, entries[i].queuedKey())
		args = append(args, m.ID, entries[i].OrderID)
	}
	if err := ackScript.Run(ctx, p.rdb, keys, args...).Err(); err != nil {
		// Not acknowledged: the entries are delivered again and found
		// already written. Nothing is lost.
		p.log.Warn("acknowledge written entries", "count", len(msgs), "err", err)
	}
}

// deliveries is how often an entry has been delivered.
func (p *Consumer) deliveries(ctx context.Context, id string) int64 {
	ps, err := p.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{
		Stream: p.stream, Group: GroupName, Start: id, End: id, Count: 1,
	}).Result()
	if err != nil || len(ps) == 0 {
		return 0
	}
	return ps[0].RetryCount
}

// parse reads an entry of this consumer's stream. An entry whose voucher
// (or bucket) belongs to another shard (not written by accept.lua, which
// queues in the shard of the unit's own keys) is malformed too: the
// scripts that settle it would touch keys of two cluster slots, which
// Redis Cluster refuses (CROSSSLOT) however often they are tried.
func (p *Consumer) parse(m redis.XMessage) (Entry, error) {
	e, err := parseEntry(m)
	if err == nil && e.shard() != p.cfg.Shard {
		return Entry{}, fmt.Errorf("entry %s: voucher %d (bucket %d of %d) is of shard %d, not of this stream's %d", m.ID, e.VoucherID, e.Bucket, e.Buckets, e.shard(), p.cfg.Shard)
	}
	return e, err
}
