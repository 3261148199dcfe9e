// Command tokens logs users in through the server's API (package
// login, which cmd/rehearse logs its crowd in with too) and writes their
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
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"seckill/loadtest/tokens/login"
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

	var buyOne func(i int, a login.Account) error
	if *buy != "" {
		buyOne = func(_ int, a login.Account) error { return buyOnce(ctx, cl, *base, a.Token, *buy) }
	}
	accounts, err := login.All(ctx, cl, []string{*base}, *first, *n, *workers, buyOne)
	if err != nil {
		return err
	}

	f, err := os.Create(*out)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	for _, a := range accounts {
		fmt.Fprintln(w, a.Token)
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

// buyOnce buys the voucher for the user: 200, or 409 already_ordered
// on a rerun.
func buyOnce(ctx context.Context, cl *http.Client, base, token, voucherID string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/seckill/"+voucherID, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := cl.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	switch {
	case err != nil:
		return err
	case resp.StatusCode == http.StatusOK:
		return nil
	case resp.StatusCode == http.StatusConflict && bytes.Contains(b, []byte(`"already_ordered"`)):
		return nil
	}
	return fmt.Errorf("POST /seckill/%s: HTTP %d: %s", voucherID, resp.StatusCode, b)
}
