// Command drive measures how fast the server turns seckill requests into
// order rows in MySQL.
//
// It logs in as the admin, creates a voucher with stock -n through the API,
// opens its connections, then fires POST /seckill/{id} once for each of -n
// users (tokens from -tokens, one per line, as loadtest/tokens writes them)
// from -c goroutines. It counts the answers, notes when the last 200
// arrived, then polls MySQL until count(voucher_orders) of the voucher
// reaches the number of 200s. It prints:
//
//   - accepted/s: 200s / (last 200 - start)
//   - persisted/s: 200s / (all rows present - start)
//   - lag: all rows present - last 200
//
// "All rows present" is when the first poll that found them all was sent:
// a COUNT reads a snapshot taken as it starts. Polling begins once every
// request has been answered, so it does not compete with the load.
//
//	go run ./loadtest/persist/drive -base http://127.0.0.1:18095 -tokens /tmp/tokens.txt -n 20000 \
//	    -dsn 'root:@tcp(127.0.0.1:3306)/seckill_persist' -label async
package main

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "drive:", err)
		os.Exit(1)
	}
}

func run() error {
	base := flag.String("base", "http://127.0.0.1:18095", "server base URL")
	tokensPath := flag.String("tokens", "/tmp/seckill-persist/tokens.txt", "file of user tokens, one per line")
	n := flag.Int("n", 20000, "users (the first n tokens) and the voucher's stock")
	conc := flag.Int("c", 128, "concurrent requests")
	dsn := flag.String("dsn", "root:@tcp(127.0.0.1:3306)/seckill_persist", "the server's database, to poll")
	admin := flag.String("admin", "13800000000", "admin phone (in the server's ADMIN_PHONES)")
	label := flag.String("label", "", "label printed with the result (e.g. the mode)")
	poll := flag.Duration("poll", 5*time.Millisecond, "MySQL poll interval")
	timeout := flag.Duration("timeout", 3*time.Minute, "give up after this long")
	redisAddr := flag.String("redis", "127.0.0.1:6379", "Redis to read command counts from (INFO commandstats), empty: none")
	flag.Parse()

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	tokens, err := readTokens(*tokensPath, *n)
	if err != nil {
		return err
	}
	tr := &http.Transport{
		MaxIdleConns: 2 * *conc, MaxIdleConnsPerHost: 2 * *conc,
		IdleConnTimeout: time.Minute, DisableCompression: true,
	}
	cl := &http.Client{Transport: tr, Timeout: 30 * time.Second}

	adminToken, err := login(ctx, cl, *base, *admin)
	if err != nil {
		return fmt.Errorf("admin login: %w", err)
	}
	now := time.Now().UTC()
	var v struct {
		ID string `json:"id"`
	}
	body := map[string]any{"title": "persist " + *label, "stock": *n,
		"begin_time": now.Add(-time.Minute).Format(time.RFC3339), "end_time": now.Add(time.Hour).Format(time.RFC3339)}
	if _, err := call(ctx, cl, http.MethodPost, *base+"/vouchers", adminToken, body, http.StatusCreated, &v); err != nil {
		return fmt.Errorf("create voucher: %w", err)
	}

	db, err := sql.Open("mysql", *dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	if err := db.PingContext(ctx); err != nil {
		return err
	}

	// Open the HTTP connections before the clock starts, and make the
	// server load the voucher into its cache.
	var warm sync.WaitGroup
	for range *conc {
		warm.Go(func() { call(ctx, cl, http.MethodGet, *base+"/vouchers/"+v.ID, "", nil, http.StatusOK, nil) })
	}
	warm.Wait()

	// Server-wide counters before and after the load, for the round trips
	// each order costs (the poller's queries come after "after").
	var rdb *redis.Client
	if *redisAddr != "" {
		rdb = redis.NewClient(&redis.Options{Addr: *redisAddr})
		defer rdb.Close()
	}
	before := counters(ctx, db, rdb)

	var next atomic.Int64
	type tally struct {
		ok       int
		last200  time.Time
		statuses map[string]int
		errs     int
		firstErr error
	}
	tallies := make([]tally, *conc)
	var wg sync.WaitGroup
	start := time.Now()
	for g := range *conc {
		t := &tallies[g]
		t.statuses = map[string]int{}
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(len(tokens)) || ctx.Err() != nil {
					return
				}
				status, err := call(ctx, cl, http.MethodPost, *base+"/seckill/"+v.ID, tokens[i], nil, 0, nil)
				switch {
				case err != nil:
					t.errs++
					if t.firstErr == nil {
						t.firstErr = err
					}
				case status == http.StatusOK:
					t.ok++
					t.last200 = time.Now()
				default:
					t.statuses[fmt.Sprint(status)]++
				}
			}
		})
	}
	wg.Wait()
	end := time.Now()
	after := counters(ctx, db, rdb)

	var ok, errs int
	var last200 time.Time
	statuses := map[string]int{}
	var firstErr error
	for _, t := range tallies {
		ok += t.ok
		errs += t.errs
		if t.last200.After(last200) {
			last200 = t.last200
		}
		for k, c := range t.statuses {
			statuses[k] += c
		}
		if firstErr == nil {
			firstErr = t.firstErr
		}
	}
	if ok == 0 {
		return fmt.Errorf("no 200 at all (statuses %v, transport errors %d, first %v)", statuses, errs, firstErr)
	}

	// Poll until every 200 is a row.
	var persistedAt time.Time
	var rows int64
	for {
		sent := time.Now()
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM voucher_orders WHERE voucher_id = ?", v.ID).Scan(&rows); err != nil {
			return fmt.Errorf("poll: %w (rows so far %d of %d)", err, rows, ok)
		}
		if rows >= int64(ok) {
			persistedAt = sent
			break
		}
		time.Sleep(*poll)
	}
	// At rest: stock + orders = initial, nobody twice.
	var left, users int64
	time.Sleep(200 * time.Millisecond)
	if err := db.QueryRowContext(ctx, "SELECT stock FROM vouchers WHERE id = ?", v.ID).Scan(&left); err != nil {
		return err
	}
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*), COUNT(DISTINCT user_id) FROM voucher_orders WHERE voucher_id = ?", v.ID).Scan(&rows, &users); err != nil {
		return err
	}
	if left+rows != int64(*n) || users != rows || rows != int64(ok) {
		return fmt.Errorf("inconsistent at rest: stock %d + orders %d != %d, or distinct users %d != orders, or orders != 200s %d", left, rows, *n, users, ok)
	}

	lag := persistedAt.Sub(last200)
	if lag < 0 {
		// In sync mode the rows are there before each 200; the poll only
		// starts after the last answer.
		lag = 0
		persistedAt = last200
	}
	acceptSecs := last200.Sub(start).Seconds()
	persistSecs := persistedAt.Sub(start).Seconds()
	keys := make([]string, 0, len(statuses))
	for k := range statuses {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var other []string
	for _, k := range keys {
		other = append(other, k+":"+fmt.Sprint(statuses[k]))
	}
	if errs > 0 {
		other = append(other, fmt.Sprintf("transport:%d", errs))
		fmt.Fprintln(os.Stderr, "drive: first transport error:", firstErr)
	}
	if len(other) == 0 {
		other = []string{"none"}
	}
	fmt.Printf("RESULT kind=%s conc=%d requests=%d ok=%d other=%s load_s=%.3f accepted_per_s=%.0f persisted_per_s=%.0f lag_ms=%.0f\n",
		*label, *conc, len(tokens), ok, strings.Join(other, ","), end.Sub(start).Seconds(),
		float64(ok)/acceptSecs, float64(ok)/persistSecs, float64(lag.Microseconds())/1000)
	if before != nil && after != nil {
		names := make([]string, 0, len(after))
		for k := range after {
			names = append(names, k)
		}
		sort.Strings(names)
		var per []string
		for _, k := range names {
			if d := float64(after[k]-before[k]) / float64(ok); d >= 0.005 {
				per = append(per, fmt.Sprintf("%s=%.2f", k, d))
			}
		}
		fmt.Printf("PER_ORDER kind=%s %s\n", *label, strings.Join(per, " "))
	}
	return nil
}

// counters reads MySQL's global status (statements by kind; Questions
// counts COM_STMT_EXECUTE but not PREPARE or CLOSE) and Redis' command
// stats, which count the commands a Lua script runs as well as the
// EVALSHA that runs it. Both are server-wide: run this alone. nil if
// either cannot be read.
func counters(ctx context.Context, db *sql.DB, rdb *redis.Client) map[string]int64 {
	out := map[string]int64{}
	rows, err := db.QueryContext(ctx, "SHOW GLOBAL STATUS WHERE Variable_name IN ('Questions','Com_stmt_prepare','Com_stmt_execute','Com_stmt_close','Com_begin','Com_commit','Com_insert','Com_update','Com_select')")
	if err != nil {
		return nil
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var v int64
		if err := rows.Scan(&name, &v); err != nil {
			return nil
		}
		out["mysql_"+strings.ToLower(name)] = v
	}
	if rdb == nil {
		return out
	}
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil
	}
	// cmdstat_evalsha:calls=123,usec=...
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		var v int64
		fmt.Sscan(calls, &v)
		out["redis_"+strings.TrimPrefix(name, "cmdstat_")] += v
	}
	return out
}

func readTokens(path string, n int) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 64*1024)
	for sc.Scan() && len(out) < n {
		if t := strings.TrimSpace(sc.Text()); t != "" {
			out = append(out, t)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) < n {
		return nil, fmt.Errorf("%s has %d tokens, need %d", path, len(out), n)
	}
	return out, nil
}

func login(ctx context.Context, cl *http.Client, base, phone string) (string, error) {
	var sent struct {
		Code string `json:"code"`
	}
	if status, err := call(ctx, cl, http.MethodPost, base+"/auth/code", "", map[string]string{"phone": phone}, http.StatusOK, &sent); err != nil {
		if status == http.StatusTooManyRequests {
			return "", fmt.Errorf("%w (the server limits login codes per phone and per client address; start a load test's server with AUTH_CODE_INTERVAL=0 AUTH_CODES_PER_DAY=0 AUTH_CODES_PER_ADDR_PER_MIN=0)", err)
		}
		return "", err
	}
	if sent.Code == "" {
		return "", errors.New("POST /auth/code answered no code: run the server with AUTH_DEV_CODES=true")
	}
	var in struct {
		Token string `json:"token"`
	}
	if _, err := call(ctx, cl, http.MethodPost, base+"/auth/login", "", map[string]string{"phone": phone, "code": sent.Code}, http.StatusOK, &in); err != nil {
		return "", err
	}
	return in.Token, nil
}

// call sends body as JSON and returns the status. With want != 0, another
// status is an error and a want response is decoded into out.
func call(ctx context.Context, cl *http.Client, method, url, token string, body any, want int, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return 0, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := cl.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return resp.StatusCode, err
	}
	if want != 0 && resp.StatusCode != want {
		return resp.StatusCode, fmt.Errorf("%s %s: HTTP %d: %s", method, url, resp.StatusCode, b)
	}
	if out != nil && resp.StatusCode == want {
		if err := json.Unmarshal(b, out); err != nil {
			return resp.StatusCode, fmt.Errorf("%s %s: decode: %w", method, url, err)
		}
	}
	return resp.StatusCode, nil
}
