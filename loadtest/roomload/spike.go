package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/stock"
)

// spikeStep measures the admission rate through a 10x spike of joins, and
// the wait estimate's error (the package doc).
func (c *config) spikeStep(tokens []string) error {
	ctx := context.Background()
	id, err := c.roomVoucher("roomload: spike", c.rate)
	if err != nil {
		return err
	}
	// The arrivals: calm, spike, calm, each join due at its own moment.
	var due []time.Duration
	at := time.Duration(0)
	for _, phase := range []struct {
		rate int
		for_ time.Duration
	}{{c.rate, c.calmFor}, {10 * c.rate, c.spikeFor}, {c.rate, c.calmFor}} {
		gap := time.Second / time.Duration(phase.rate)
		for end := at + phase.for_; at < end; at += gap {
			due = append(due, at)
		}
	}
	if len(due) > len(tokens) {
		return fmt.Errorf("%d tokens needed, %d left", len(due), len(tokens))
	}
	fmt.Printf("spike: voucher %d admits %d a second; joins %d/s for %v, %d/s for %v, %d/s for %v (%d joins)\n",
		id, c.rate, c.rate, c.calmFor, 10*c.rate, c.spikeFor, c.rate, c.calmFor, len(due))

	// serving, read from Redis every 100 ms.
	stateKey := stock.KeyOf(id, "room:state")
	type sample struct {
		at      time.Duration
		serving int64
	}
	var samples []sample
	start := time.Now().Add(200 * time.Millisecond)
	sampling := make(chan struct{})
	var sampled sync.WaitGroup
	sampled.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-sampling:
				return
			case <-tick.C:
			}
			n, err := c.rdb.HGet(ctx, stateKey, "serving").Int64()
			if err != nil && !errors.Is(err, redis.Nil) {
				continue
			}
			samples = append(samples, sample{time.Since(start), n})
		}
	})

	type result struct {
		late      time.Duration // the generator's lateness
		answered  time.Time
		eta       *int64
		joinErr   error
		joinTaken time.Duration // from when the join was due
		watched   bool
		admitted  time.Time // zero: the stream ended first
		watchErr  error
	}
	results := make([]result, len(due))
	var wg sync.WaitGroup
	wctx, stopWatching := context.WithTimeout(ctx, 10*time.Minute)
	defer stopWatching()
	for i, d := range due {
		time.Sleep(time.Until(start.Add(d)))
		wg.Go(func() {
			r := &results[i]
			r.late = time.Since(start.Add(d))
			p, err := c.join(id, tokens[i])
			r.answered, r.joinErr, r.eta = time.Now(), err, p.ETASeconds
			r.joinTaken = r.answered.Sub(start.Add(d))
			if err != nil || i%c.sample != 0 {
				return
			}
			r.watched = true
			r.admitted, _, r.watchErr = c.watch(wctx, id, tokens[i], true, nil)
		})
	}
	wg.Wait()
	close(sampling)
	sampled.Wait()

	if len(samples) == 0 {
		return errors.New("no sample of the room's serving was read from Redis")
	}
	// Admissions a second, from serving's samples.
	perSecond := map[int]int64{}
	var prev int64
	for _, s := range samples {
		sec := int(s.at / time.Second)
		perSecond[sec] += s.serving - prev
		prev = s.serving
	}
	last := int(samples[len(samples)-1].at / time.Second)
	arrivals := map[int]int{}
	for _, d := range due {
		arrivals[int(d/time.Second)]++
	}
	fmt.Println("spike: second  joins due  admitted")
	for s := 0; s <= last; s++ {
		fmt.Printf("spike: %6d %10d %9d\n", s, arrivals[s], perSecond[s])
	}
	// The spec's bound: at most rate x (t + 1) admitted in any t seconds,
	// checked over the 100 ms samples.
	worst := 0.0
	for i := range samples {
		for j := i + 1; j < len(samples); j++ {
			t := (samples[j].at - samples[i].at).Seconds()
			n := float64(samples[j].serving - samples[i].serving)
			worst = math.Max(worst, n/(float64(c.rate)*(t+1)))
		}
	}
	fmt.Printf("spike: the most admitted in any stretch against the bound rate x (t + 1): %.3f of it\n", worst)

	var joinErrs, unwatched int
	var lates, takes, errs []float64
	noEta := 0
	var firstErr error
	for _, r := range results {
		lates = append(lates, r.late.Seconds()*1000)
		takes = append(takes, r.joinTaken.Seconds()*1000) // answered or failed, timed alike
		if r.joinErr != nil {
			joinErrs++
			firstErr = cmp.Or(firstErr, r.joinErr)
			continue
		}
		if !r.watched {
			continue
		}
		if r.watchErr != nil || r.admitted.IsZero() {
			unwatched++ // the stream failed or ended before admission
			firstErr = cmp.Or(firstErr, r.watchErr)
			continue
		}
		if r.eta == nil {
			noEta++
			continue
		}
		errs = append(errs, r.admitted.Sub(r.answered).Seconds()-float64(*r.eta))
	}
	fmt.Printf("spike: generator lateness ms p50 %.1f p99 %.1f max %.1f; join answered (from when due) ms p50 %.1f p99 %.1f p99.9 %.1f; %d joins failed, %d streams ended before admission\n",
		q(lates, .5), q(lates, .99), q(lates, 1), q(takes, .5), q(takes, .99), q(takes, .999), joinErrs, unwatched)
	if firstErr != nil {
		fmt.Println("spike: the first error:", firstErr)
	}
	fmt.Printf("eta: %d watched joiners; wait - eta_seconds, s: p1 %.2f p10 %.2f p50 %.2f p90 %.2f p99 %.2f (min %.2f max %.2f); %d without an estimate\n",
		len(errs), q(errs, .01), q(errs, .1), q(errs, .5), q(errs, .9), q(errs, .99), q(errs, 0), q(errs, 1), noEta)
	abs := make([]float64, len(errs))
	for i, e := range errs {
		abs[i] = math.Abs(e)
	}
	fmt.Printf("eta: |error| s: p50 %.2f p90 %.2f p99 %.2f\n", q(abs, .5), q(abs, .9), q(abs, .99))
	return nil
}
