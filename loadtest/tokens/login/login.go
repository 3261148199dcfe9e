// Package login logs test users in through the server's API, as a load
// test needs them: many distinct accounts, one per simulated buyer, each
// with a token. loadtest/tokens writes their tokens to a file for wrk and
// k6; cmd/rehearse logs its crowd in with it.
//
// The server must answer the login code (AUTH_DEV_CODES on, as in the
// embedded demo): a login asks POST /auth/code for a code and trades it
// at POST /auth/login. Every login comes from one address, so the
// server's per-address limits on codes should be off for a load test
// (AUTH_CODE_INTERVAL=0 AUTH_CODES_PER_DAY=0 AUTH_CODES_PER_ADDR_PER_MIN=0);
// its cap on logins in flight from one address is waited out.
package login

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// An Account is a logged-in user: the server's user ID and a token.
type Account struct {
	ID, Token string
}

// ErrNoCode is a server that sent the code without answering it: its
// codes go to the phones (AUTH_DEV_CODES off), which a load test must not
// log in.
var ErrNoCode = errors.New("login: POST /auth/code answered no code: the server must run with AUTH_DEV_CODES=true")

// An Error is an answer other than the one wanted.
type Error struct {
	Status     int
	Body       []byte
	RetryAfter time.Duration // Retry-After, 0 when absent
}

func (e *Error) Error() string { return fmt.Sprintf("HTTP %d: %s", e.Status, e.Body) }

// limitsHint explains a 429 from POST /auth/code.
const limitsHint = "the server limits login codes per phone and per client address; start a load test's server with AUTH_CODE_INTERVAL=0 AUTH_CODES_PER_DAY=0 AUTH_CODES_PER_ADDR_PER_MIN=0"

// One logs phone in on the server at base. An address may have only a
// few logins in flight at once (the server's limit on guessing from one
// address): past them it answers 429 with Retry-After, and One comes back
// then, up to 30 times.
func One(ctx context.Context, cl *http.Client, base, phone string) (Account, error) {
	var sent struct {
		Code string `json:"code"`
	}
	if err := post(ctx, cl, base+"/auth/code", map[string]string{"phone": phone}, &sent); err != nil {
		var e *Error
		if errors.As(err, &e) && e.Status == http.StatusTooManyRequests {
			return Account{}, fmt.Errorf("%w (%s)", err, limitsHint)
		}
		return Account{}, err
	}
	if sent.Code == "" {
		return Account{}, ErrNoCode
	}
	var in struct {
		Token string `json:"token"`
		User  struct {
			ID string `json:"id"`
		} `json:"user"`
	}
	for try := 0; ; try++ {
		err := post(ctx, cl, base+"/auth/login", map[string]string{"phone": phone, "code": sent.Code}, &in)
		if err == nil {
			break
		}
		var e *Error
		if !errors.As(err, &e) || e.Status != http.StatusTooManyRequests || try == 30 || e.RetryAfter > 5*time.Second {
			return Account{}, err
		}
		select {
		case <-ctx.Done():
			return Account{}, ctx.Err()
		case <-time.After(max(e.RetryAfter, 100*time.Millisecond)):
		}
	}
	if in.Token == "" || in.User.ID == "" {
		return Account{}, errors.New("login: POST /auth/login answered no token or no user")
	}
	return Account{in.User.ID, in.Token}, nil
}

// All logs n users in, phones first, first+1, ..., workers at once, the
// i-th on bases[i % len(bases)]; each is given to done, if not nil, once
// logged in (a tool's extra step: a first purchase, say), and a done that
// fails stops the rest. The first logs in alone: a server that answers no
// code (a real SMS gateway behind it) stops them after one code sent, not
// after one per worker to strangers' phones.
func All(ctx context.Context, cl *http.Client, bases []string, first int64, n, workers int, done func(i int, a Account) error) ([]Account, error) {
	out := make([]Account, n)
	if n == 0 {
		return out, nil
	}
	if workers < 1 || len(bases) == 0 {
		return nil, errors.New("login: no workers, or no server")
	}
	one := func(ctx context.Context, i int) error {
		phone := strconv.FormatInt(first+int64(i), 10)
		a, err := One(ctx, cl, bases[i%len(bases)], phone)
		if err == nil && done != nil {
			err = done(i, a)
		}
		if err != nil {
			return fmt.Errorf("user %s: %w", phone, err)
		}
		out[i] = a
		return nil
	}
	if err := one(ctx, 0); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range jobs {
				if err := one(ctx, i); err != nil {
					cancel(err)
					return
				}
			}
		})
	}
feed:
	for i := 1; i < n; i++ {
		select {
		case jobs <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return nil, err
	}
	return out, nil
}

// post sends body as JSON and decodes a 200's answer into out.
func post(ctx context.Context, cl *http.Client, url string, body, out any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := cl.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err = io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		after, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
		return &Error{Status: resp.StatusCode, Body: b, RetryAfter: time.Duration(max(after, 0)) * time.Second}
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("POST %s: decode: %w", url, err)
	}
	return nil
}
