package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"seckill/loadtest/tokens/login"
)

// The calls the rehearsal makes besides the crowd's presses, each as
// docs/api.md describes it: logging users in, making the voucher, and
// asking the server afterwards what it did.

// apiError is an answer other than the one wanted.
type apiError struct {
	status     int
	code       string // the error body's code
	body       string
	retryAfter time.Duration
}

func (e *apiError) Error() string { return fmt.Sprintf("HTTP %d: %s", e.status, e.body) }

// call sends body (nil: none) as JSON with token (if any) and decodes an
// answer of status want into out (if not nil).
func call(ctx context.Context, cl *http.Client, method, url, token string, body any, want int, out any, header ...string) error {
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
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
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
		return &apiError{status: resp.StatusCode, code: errorCode(b), body: string(b), retryAfter: retryAfter(resp.Header)}
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("%s %s: decode: %w", method, url, err)
		}
	}
	return nil
}

// errorCode reads the code of the contract's error body, "" if none.
func errorCode(body []byte) string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) != nil {
		return ""
	}
	return e.Error.Code
}

// retryAfter reads Retry-After's whole seconds; 0 when absent or not a
// number (the HTTP date form is not one the server sends).
func retryAfter(h http.Header) time.Duration {
	n, err := strconv.Atoi(h.Get("Retry-After"))
	if err != nil || n < 0 {
		return 0
	}
	return time.Duration(n) * time.Second
}

// An account is a logged-in user: the server's ID and a token.
type account = login.Account

// logIn logs the crowd in: phones first, first+1, ..., c at once, spread
// over bases, with what the rehearsal's user can do about a refusal.
func logIn(ctx context.Context, cl *http.Client, bases []string, first int64, n, c int) ([]account, error) {
	as, err := login.All(ctx, cl, bases, first, n, c, nil)
	switch {
	case errors.Is(err, login.ErrNoCode):
		return nil, fmt.Errorf("%w, or give -tokens", err)
	case err != nil:
		return nil, fmt.Errorf("log the crowd in (other phones: -first): %w", err)
	}
	return as, nil
}

// readTokens reads a token file (loadtest/tokens writes one: a token a
// line) and takes each user's ID from its token's sub claim, unverified:
// the server checks the token, the rehearsal only needs to know whose it is.
func readTokens(path string, n int) ([]account, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []account
	lineOf := map[string]int{} // user ID -> the line that gave it
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	for line := 1; sc.Scan() && len(out) < n; line++ {
		tok := strings.TrimSpace(sc.Text())
		if tok == "" {
			continue
		}
		id, err := subject(tok)
		if err != nil {
			return nil, fmt.Errorf("%s, line %d: %w", path, line, err)
		}
		// Two tokens of one user would be one buyer pressing twice, not
		// two buyers: the crowd is distinct accounts.
		if first, ok := lineOf[id]; ok {
			return nil, fmt.Errorf("%s, line %d: a token of user %s, as on line %d: each simulated user needs an account of its own", path, line, id, first)
		}
		lineOf[id] = line
		out = append(out, account{ID: id, Token: tok})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) < n {
		return nil, fmt.Errorf("%s holds %d tokens; the crowd needs %d (users and bots): make more with go run ./loadtest/tokens -n %d", path, len(out), n, n)
	}
	return out, nil
}

// subject reads a JWT's sub claim without checking its signature.
func subject(token string) (string, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return "", errors.New("not a JWT")
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return "", fmt.Errorf("JWT payload: %w", err)
	}
	var claims struct {
		Sub string `json:"sub"`
	}
	if err := json.Unmarshal(b, &claims); err != nil || claims.Sub == "" {
		return "", errors.New("JWT without sub")
	}
	return claims.Sub, nil
}

// voucherJSON is a voucher as the server answers it.
type voucherJSON struct {
	ID    string     `json:"id"`
	Stock int64      `json:"stock"`
	Begin time.Time  `json:"begin_time"`
	End   time.Time  `json:"end_time"`
	Room  *roomState `json:"room"`
}

// roomJSON is a waiting room as POST /vouchers takes it.
type roomJSON struct {
	OpensAt        time.Time `json:"opens_at"`
	AdmitPerSecond int       `json:"admit_per_second"`
	HoldFor        int       `json:"hold_for"`
}

// makeVoucher creates the rehearsal's voucher, with a waiting room if
// room is not nil. The Idempotency-Key keeps a retried request from
// making two.
func makeVoucher(ctx context.Context, cl *http.Client, base, admin, title string, stock int64, begin, end time.Time, room *roomJSON) (voucherJSON, error) {
	body := map[string]any{"title": title, "stock": stock,
		"begin_time": begin.UTC().Format(time.RFC3339), "end_time": end.UTC().Format(time.RFC3339)}
	if room != nil {
		body["room"] = room
	}
	var v voucherJSON
	key := "rehearse-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	err := call(ctx, cl, http.MethodPost, base+"/vouchers", admin, body, http.StatusCreated, &v, "Idempotency-Key", key)
	if err == nil && room != nil && v.Room == nil {
		err = errors.New("the server made the voucher without its waiting room: it does not serve rooms yet (docs/api.md, \"Waiting room\")")
	}
	return v, err
}

// getVoucher reads the voucher as anyone may.
func getVoucher(ctx context.Context, cl *http.Client, base, id string) (voucherJSON, error) {
	var v voucherJSON
	err := call(ctx, cl, http.MethodGet, base+"/vouchers/"+id, "", nil, http.StatusOK, &v)
	return v, err
}

// getOrder asks for an order with its buyer's token. The error is the
// request's, for persist to judge; the answer says what came back either
// way (Status 0: none).
func getOrder(ctx context.Context, cl *http.Client, base, token, id string) (OrderSeen, error) {
	var o struct {
		ID      string    `json:"id"`
		User    string    `json:"user_id"`
		Voucher string    `json:"voucher_id"`
		Status  string    `json:"status"`
		Created time.Time `json:"created_at"`
	}
	err := call(ctx, cl, http.MethodGet, base+"/orders/"+id, token, nil, http.StatusOK, &o)
	var ae *apiError
	switch {
	case err == nil:
		return OrderSeen{ID: id, Status: 200, Owner: o.User, Voucher: o.Voucher, State: o.Status, Created: o.Created}, nil
	case errors.As(err, &ae):
		return OrderSeen{ID: id, Status: ae.status, Err: ae.code}, err
	}
	return OrderSeen{ID: id, Err: cause(err)}, err
}

// nextEvent reads server-sent events until one named name, and returns
// its data.
func nextEvent(r *bufio.Reader, name string) ([]byte, error) {
	event, data := "", []byte(nil)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return nil, err
		}
		line = strings.TrimRight(line, "\r\n")
		switch {
		case line == "":
			if event == name && data != nil {
				return data, nil
			}
			event, data = "", nil
		case strings.HasPrefix(line, "event:"):
			event = strings.TrimSpace(strings.TrimPrefix(line, "event:"))
		case strings.HasPrefix(line, "data:"):
			if data != nil {
				data = append(data, '\n')
			}
			data = append(data, strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " ")...)
		}
	}
}
