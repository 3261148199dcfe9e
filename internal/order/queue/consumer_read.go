package queue

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// This file is the consumer's side of the stream (see consumer.go): what
// it reads (new entries, its own pending ones after a restart or a
// failed write, those an idle consumer held), and what it keeps tidy (the
// stream trimmed of written entries, the group of consumers long gone).
// It writes what it reads with handle (consumer_write.go).

var (
	//go:embed prune.lua
	pruneSrc    string
	pruneScript = redis.NewScript(pruneSrc)
)

// ownPending reads up to size entries delivered to this consumer and not
// yet acknowledged, without delivering them again (XPENDING, then XRANGE).
func (p *Consumer) ownPending(ctx context.Context) ([]redis.XMessage, error) {
	ps, err := p.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{
		Stream: p.stream, Group: GroupName, Start: "-", End: "+", Count: int64(p.size), Consumer: p.cfg.Consumer,
	}).Result()
	if err != nil || len(ps) == 0 {
		return nil, err
	}
	pipe := p.rdb.Pipeline()
	reads := make([]*redis.XMessageSliceCmd, len(ps))
	for i, e := range ps {
		reads[i] = pipe.XRangeN(ctx, p.stream, e.ID, e.ID, 1)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	var msgs []redis.XMessage
	for _, r := range reads {
		msgs = append(msgs, r.Val()...) // none: trimmed after another consumer wrote it
	}
	return msgs, nil
}

// ensureGroup creates the group, and the stream with it, if missing:
// reading with a group that does not exist fails with NOGROUP. "0" makes
// a new group start at the oldest entry, so entries accepted before the
// group existed are not skipped.
func (p *Consumer) ensureGroup(ctx context.Context) error {
	err := p.rdb.XGroupCreateMkStream(ctx, p.stream, GroupName, "0").Err()
	if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return fmt.Errorf("create group %s: %w", GroupName, err)
	}
	return nil
}

// readNew reads entries never delivered to anyone, and writes them. block
// 0 means do not wait.
func (p *Consumer) readNew(ctx context.Context, block time.Duration) (int, error) {
	args := &redis.XReadGroupArgs{
		Group: GroupName, Consumer: p.cfg.Consumer,
		Streams: []string{p.stream, ">"}, Count: int64(p.size), Block: block,
	}
	if block == 0 {
		args.Block = -1 // go-redis: negative leaves BLOCK out; 0 would block forever
	}
	streams, err := p.rdb.XReadGroup(ctx, args).Result()
	if errors.Is(err, redis.Nil) {
		return 0, nil // a blocking read that timed out
	}
	if err != nil {
		if strings.HasPrefix(err.Error(), "NOGROUP") {
			return 0, p.ensureGroup(ctx) // Redis lost the group (a flush)
		}
		return 0, err
	}
	n := 0
	for _, s := range streams {
		n += len(s.Messages)
		if err := p.handle(ctx, s.Messages, false); err != nil {
			p.fell(err)
		}
	}
	return n, nil
}

// catchUp rereads the entries delivered to this consumer and not yet
// acknowledged (ID "0" instead of ">"), and writes them.
func (p *Consumer) catchUp(ctx context.Context) {
	from := "0"
	for ctx.Err() == nil {
		streams, err := p.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
			Group: GroupName, Consumer: p.cfg.Consumer,
			Streams: []string{p.stream, from}, Count: int64(p.size), Block: -1,
		}).Result()
		if err != nil || len(streams) == 0 || len(streams[0].Messages) == 0 {
			return
		}
		msgs := streams[0].Messages
		if err := p.handle(ctx, msgs, true); err != nil {
			p.fell(err)
			return // the rest wait: rereading them would keep them from being claimed
		}
		from = msgs[len(msgs)-1].ID
	}
}

// claim takes over entries another consumer was given but has not
// acknowledged for ClaimIdle: that consumer's process has most likely
// died. XAUTOCLAIM walks the pending list with a cursor; carrying it from
// call to call makes each call continue where the last one stopped.
func (p *Consumer) claim(ctx context.Context) {
	msgs, next, err := p.rdb.XAutoClaim(ctx, &redis.XAutoClaimArgs{
		Stream: p.stream, Group: GroupName, Consumer: p.cfg.Consumer,
		MinIdle: p.cfg.ClaimIdle, Start: p.claimCursor, Count: int64(p.size),
	}).Result()
	if err != nil {
		if !errors.Is(err, redis.Nil) {
			p.log.Warn("claim idle entries", "err", err)
		}
		return
	}
	p.claimCursor = next
	if len(msgs) > 0 {
		p.log.Info("claimed entries of an idle consumer", "count", len(msgs))
		if err := p.handle(ctx, msgs, true); err != nil {
			p.fell(err)
		}
	}
}

// trim drops entries every consumer has acknowledged: those older than
// the oldest pending entry, or than the last delivered one when none is
// pending. Never an entry that is not yet written.
func (p *Consumer) trim(ctx context.Context) {
	groups, err := p.rdb.XInfoGroups(ctx, p.stream).Result()
	if err != nil {
		return
	}
	var minID string
	for _, g := range groups {
		if g.Name != GroupName {
			continue
		}
		minID = g.LastDeliveredID
		if g.Pending > 0 {
			sum, err := p.rdb.XPending(ctx, p.stream, GroupName).Result()
			if err != nil {
				return
			}
			minID = sum.Lower
		}
	}
	if minID == "" || minID == "0-0" {
		return
	}
	if err := p.rdb.XTrimMinIDApprox(ctx, p.stream, minID, 0).Err(); err != nil {
		p.log.Warn("trim stream", "err", err)
	}
}

// pruneConsumers removes from the group the consumers that hold no entry
// and have not read for a long time: instances that are gone (a name is
// host:port, and containers get new hosts). A live consumer reads every
// 200 ms; one that is sick (not reading) and holds nothing loses nothing by
// being removed: its next read adds it again.
func (p *Consumer) pruneConsumers(ctx context.Context) {
	consumers, err := p.rdb.XInfoConsumers(ctx, p.stream, GroupName).Result()
	if err != nil {
		return
	}
	idle := max(time.Hour, 100*p.cfg.ClaimIdle)
	for _, c := range consumers {
		if c.Name != p.cfg.Consumer && c.Pending == 0 && c.Idle > idle {
			if n, err := pruneScript.Run(ctx, p.rdb, []string{p.stream}, GroupName, c.Name).Int(); err == nil && n == 1 {
				p.log.Info("removed a consumer gone for long", "gone", c.Name, "idle", c.Idle)
			}
		}
	}
}
