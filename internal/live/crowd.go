package live

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"time"

	"seckill/internal/apperr"
	"seckill/internal/web"
)

// Crowd is a built-in simulated crowd: users who each press a voucher's buy
// button twice (a double click), at a steady rate, through the server's own
// handler (every guard, limit and counter sees them as it sees real
// buyers). It is for demonstrations: the users are real rows, with the
// phones crowdPhone names.
type Crowd struct {
	*web.Loopback // the server's router, the crowd's target; and the crowds' lifetime
	tokens        func(ctx context.Context, phone string) (string, error)
	log           *slog.Logger
	running       sync.Map // voucher ID -> struct{}
}

// CrowdInput is the body of POST /live/{voucherId}/crowd.
type CrowdInput struct {
	Users int `json:"users"` // default 500
	Rate  int `json:"rate"`  // presses a second, default 1000
}

// Bounds on a crowd: enough to sell out a demo voucher and show the flood
// after, not a load test (use loadtest/ for that).
const (
	defaultCrowd = 500
	maxCrowd     = 20_000
	defaultRate  = 1000
	maxRate      = 20_000
)

// ErrCrowdRunning refuses a second crowd for a voucher while one runs.
var ErrCrowdRunning = apperr.New(apperr.Busy, "a crowd is already buying this voucher")

// NewCrowd returns a Crowd that signs its users in with tokens.
// SetTarget names the router the presses go to, and Close stops the
// crowds and waits for them (web.Loopback).
func NewCrowd(tokens func(ctx context.Context, phone string) (string, error), log *slog.Logger) *Crowd {
	return &Crowd{Loopback: web.NewLoopback(), tokens: tokens, log: log}
}

// Start sends a crowd at voucherID in the background; it returns the
// input with its defaults filled in.
func (c *Crowd) Start(voucherID int64, in CrowdInput) (CrowdInput, error) {
	if in.Users == 0 {
		in.Users = defaultCrowd
	}
	if in.Rate == 0 {
		in.Rate = defaultRate
	}
	if in.Users < 1 || in.Users > maxCrowd || in.Rate < 1 || in.Rate > maxRate {
		return in, apperr.Invalid(fmt.Sprintf("users must be between 1 and %d, rate between 1 and %d", maxCrowd, maxRate))
	}
	if !c.Ready() {
		return in, errors.New("live: crowd has no target")
	}
	if _, busy := c.running.LoadOrStore(voucherID, struct{}{}); busy {
		return in, ErrCrowdRunning
	}
	c.Go(func() {
		defer c.running.Delete(voucherID)
		if err := c.run(voucherID, in); err != nil && c.Context().Err() == nil {
			c.log.Warn("live: crowd", "voucher", voucherID, "err", err)
		}
	})
	return in, nil
}

// crowdPhone is the phone of the crowd's user i: 100 followed by i in
// eight digits, 10000000000 and up. The crowd signs its users in without
// a code (it needs none), so a phone of its own that belonged to someone
// would sign that person up and spend their one order of the voucher. No
// one has these: China's mobile numbers begin 13 to 19 (10, 11 and 12
// begin short service numbers: 10086, 110, 12306), and read as a North
// American number (+1) they have area code 000, which cannot exist. They
// still pass package auth's check (11 digits, the first 1), and no SMS
// can reach them: behind a real SMS gateway no one logs in as one of them.
func crowdPhone(i int) string { return fmt.Sprintf("100%08d", i) }

func (c *Crowd) run(voucherID int64, in CrowdInput) error {
	ctx := c.Context()
	tokens := make([]string, in.Users)
	for i := range tokens {
		t, err := c.tokens(ctx, crowdPhone(i))
		if err != nil {
			return fmt.Errorf("sign in user %d of the crowd: %w", i, err)
		}
		tokens[i] = t
	}
	path := "/seckill/" + strconv.FormatInt(voucherID, 10)
	presses := make(chan string)
	var workers sync.WaitGroup
	for range 32 {
		workers.Go(func() {
			for token := range presses {
				req := httptest.NewRequestWithContext(ctx, http.MethodPost, path, nil)
				req.Header.Set("Authorization", "Bearer "+token)
				c.Serve(req)
			}
		})
	}
	defer workers.Wait()
	defer close(presses)
	every := time.Second / time.Duration(in.Rate)
	next := time.Now()
	for range 2 { // each user presses twice
		for _, token := range tokens {
			next = next.Add(every)
			if d := time.Until(next); d > 0 {
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(d):
				}
			}
			select {
			case <-ctx.Done():
				return nil
			case presses <- token:
			}
		}
	}
	return nil
}
