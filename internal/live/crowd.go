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

// CrowdInput is the body of POST /live/{voucherId}/crowd. Pointers tell
// an absent field (or null), which takes its default, from a 0, which is
// refused: a crowd of 0 users is a mistake, not a wish for 500.
type CrowdInput struct {
	Users *int `json:"users"` // default 500
	Rate  *int `json:"rate"`  // presses a second, default 1000
}

// Started is a crowd that started: its size and rate with the defaults
// filled in, and its users, crowdPhone(First) to crowdPhone(First+Users-1).
type Started struct {
	Users, Rate, First int
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
var ErrCrowdRunning = apperr.New(apperr.Busy, "a crowd is already buying this voucher; start another when it is done (each user presses twice, at the rate asked)")

// NewCrowd returns a Crowd that signs its users in with tokens.
// SetTarget names the router the presses go to, and Close stops the
// crowds and waits for them (web.Loopback).
func NewCrowd(tokens func(ctx context.Context, phone string) (string, error), log *slog.Logger) *Crowd {
	return &Crowd{Loopback: web.NewLoopback(), tokens: tokens, log: log}
}

// Start sends a crowd at voucherID in the background. reserve hands out
// the crowd's users: n user numbers never handed out before, from the
// first it returns (Handler counts them in Redis), so that every crowd is
// new users. A crowd of users who had bought already would only be
// answered already_ordered: a second crowd on a voucher would show
// nothing of a sale.
func (c *Crowd) Start(ctx context.Context, voucherID int64, in CrowdInput, reserve func(ctx context.Context, n int) (int, error)) (Started, error) {
	st := Started{Users: defaultCrowd, Rate: defaultRate}
	if in.Users != nil {
		st.Users = *in.Users
	}
	if in.Rate != nil {
		st.Rate = *in.Rate
	}
	if st.Users < 1 || st.Users > maxCrowd || st.Rate < 1 || st.Rate > maxRate {
		return st, apperr.Invalid(fmt.Sprintf("users must be between 1 and %d (%d when absent), rate between 1 and %d (%d when absent)", maxCrowd, defaultCrowd, maxRate, defaultRate))
	}
	if !c.Ready() {
		return st, errors.New("live: crowd has no target")
	}
	if _, busy := c.running.LoadOrStore(voucherID, struct{}{}); busy {
		return st, ErrCrowdRunning
	}
	first, err := reserve(ctx, st.Users)
	if err != nil {
		c.running.Delete(voucherID)
		return st, apperr.Down(fmt.Errorf("reserve the crowd's users: %w", err))
	}
	st.First = first
	c.Go(func() {
		defer c.running.Delete(voucherID)
		if err := c.run(voucherID, st); err != nil && c.Context().Err() == nil {
			c.log.Warn("live: crowd", "voucher", voucherID, "err", err)
		}
	})
	return st, nil
}

// crowdPhones is how many phones crowdPhone can spell: user numbers
// wrap around past it (after a hundred million crowd users, when the
// first ones have long been forgotten).
const crowdPhones = 100_000_000

// crowdPhone is the phone of the crowd's user i: 100 followed by i in
// eight digits (modulo crowdPhones), 10000000000 and up. The crowd signs its users in without
// a code (it needs none), so a phone of its own that belonged to someone
// would sign that person up and spend their one order of the voucher. No
// one has these: China's mobile numbers begin 13 to 19 (10, 11 and 12
// begin short service numbers: 10086, 110, 12306), and read as a North
// American number (+1) they have area code 000, which cannot exist. They
// still pass package auth's check (11 digits, the first 1), and no SMS
// can reach them: behind a real SMS gateway no one logs in as one of them.
func crowdPhone(i int) string { return fmt.Sprintf("100%08d", i%crowdPhones) }

func (c *Crowd) run(voucherID int64, in Started) error {
	ctx := c.Context()
	tokens := make([]string, in.Users)
	for i := range tokens {
		t, err := c.tokens(ctx, crowdPhone(in.First+i))
		if err != nil {
			return fmt.Errorf("sign in user %d of the crowd: %w", in.First+i, err)
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
