// Command tokens logs users in through the server's API and writes their
// tokens to a file, one per line, for load generators (wrk, k6) to send as
// Authorization: Bearer <token>. The server must run with AUTH_DEV_CODES
// on, so that POST /auth/code answers the code, and with the login code
// limits off (AUTH_CODE_INTERVAL=0 AUTH_CODES_PER_DAY=0
// AUTH_CODES_PER_ADDR_PER_MIN=0), since every login comes from one address.
//
//	go run ./loadtest/tokens -base http://127.0.0.1:8080 -n 2000 -first 13900000000 -out /tmp/tokens.txt
//
// With -buy <voucherID> each user also buys that voucher once (200, or 409
// already_ordered on a rerun): that makes users for the already-ordered
// reject path.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "tokens:", err)
		os.Exit(1)
	}
}

func run() error {
	base := flag.String("base", "http://127.0.0.1:8080", "server base URL")
	n := flag.Int("n", 1000, "number of users")
	first := flag.Int64("first", 13900000000, "first phone number; users get first, first+1, ...")
	out := flag.String("out", "/tmp/seckill-tokens.txt", "file to write tokens to, one per line")
	buy := flag.String("buy", "", "voucher ID each user buys once after logging in")
	workers := flag.Int("c", 16, "concurrent logins")
	timeout := flag.Duration("timeout", 2*time.Minute, "give up after this long")
	flag.Parse()
	if *n <= 0 || *first < 10_000_000_000 || *first+int64(*n) > 19_999_999_999 {
		return errors.New("-n must be positive and -first..-first+n must be 11-digit numbers starting with 1")
	}

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	cl := &http.Client{Timeout: 10 * time.Second}

	tokens := make([]string, *n)
	jobs := make(chan int)
	errc := make(chan error, *workers)
	var wg sync.WaitGroup
	for range *workers {
		wg.Go(func() {
			for i := range jobs {
				phone := strconv.FormatInt(*first+int64(i), 10)
				tok, err := login(ctx, cl, *base, phone)
				if err == nil && *buy != "" {
					err = buyOnce(ctx, cl, *base, tok, *buy)
				}
				if err != nil {
					errc <- fmt.Errorf("user %s: %w", phone, err)
					cancel()
					return
				}
				tokens[i] = tok
			}
		})
	}
feed:
	for i := range *n {
		select {
		case jobs <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
	}
	if err := ctx.Err(); err != nil {
		return err
	}

	f, err := os.Create(*out)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	for _, t := range tokens {
		fmt.Fprintln(w, t)
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "tokens: wrote %d tokens to %s\n", *n, *out)
	return nil
}

func login(ctx context.Context, cl *http.Client, base, phone string) (string, error) {
	var sent struct {
		Code string `json:"code"`
	}
	if err := call(ctx, cl, http.MethodPost, base+"/auth/code", "", map[string]string{"phone": phone}, http.StatusOK, &sent); err != nil {
		var st *statusError
		if errors.As(err, &st) && st.status == http.StatusTooManyRequests {
			return "", fmt.Errorf("%w (%s)", err, codeLimitsHint)
		}
		return "", err
	}
	if sent.Code == "" {
		return "", errors.New("POST /auth/code answered no code: run the server with AUTH_DEV_CODES=true")
	}
	var in struct {
		Token string `json:"token"`
	}
	// An address may have only a few logins in flight at once (the
	// server's limit on guessing from one address): past them it answers
	// 429 with Retry-After, and this tool, logging everyone in from one
	// address, comes back then.
	for try := 0; ; try++ {
		err := call(ctx, cl, http.MethodPost, base+"/auth/login", "", map[string]string{"phone": phone, "code": sent.Code}, http.StatusOK, &in)
		var st *statusError
		if err == nil {
			break
		}
		if !errors.As(err, &st) || st.status != http.StatusTooManyRequests || try == 30 || st.retryAfter > 5*time.Second {
			return "", err
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(st.retryAfter):
		}
	}
	if in.Token == "" {
		return "", errors.New("POST /auth/login answered no token")
	}
	return in.Token, nil
}

// codeLimitsHint explains a 429 from POST /auth/code: this tool logs
// thousands of users in from one address, which the server's default
// limits refuse after the twentieth.
const codeLimitsHint = "the server limits login codes per phone and per client address; start a load test's server with AUTH_CODE_INTERVAL=0 AUTH_CODES_PER_DAY=0 AUTH_CODES_PER_ADDR_PER_MIN=0"

func buyOnce(ctx context.Context, cl *http.Client, base, token, voucherID string) error {
	err := call(ctx, cl, http.MethodPost, base+"/seckill/"+voucherID, token, nil, http.StatusOK, nil)
	var st *statusError
	if errors.As(err, &st) && st.status == http.StatusConflict && bytes.Contains(st.body, []byte(`"already_ordered"`)) {
		return nil
	}
	return err
}

type statusError struct {
	status     int
	body       []byte
	retryAfter time.Duration // a 429's Retry-After (at least a second)
}

func (e *statusError) Error() string { return fmt.Sprintf("HTTP %d: %s", e.status, e.body) }

// call sends body as JSON and decodes a response with status want into out.
func call(ctx context.Context, cl *http.Client, method, url, token string, body any, want int, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := cl.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != want {
		after, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
		return &statusError{status: resp.StatusCode, body: b, retryAfter: time.Duration(max(after, 1)) * time.Second}
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("%s %s: decode: %w", method, url, err)
		}
	}
	return nil
}
