// Command roomload measures a waiting room under load, against a running
// server (loadtest/room.sh starts one, with a Redis of its own):
//
//   - streams: what the events stream costs. N users join a room that
//     admits one buyer a second (so that every waiter's `ahead` changes
//     every second, and each of their streams sends an event a second);
//     the server's CPU and Redis' commands and CPU are read over a window
//     without streams, then over one with the N streams open. The
//     difference, per thousand waiters, is the stream's cost.
//
//   - spike: the admission rate held against a 10x spike of joins. Joins
//     arrive at the room's rate, then at ten times it, then at it again,
//     each sent when it is due (open arrivals); the room's `serving` is
//     read from Redis every 100 ms, and each second's admissions are
//     printed with the spec's bound (at most rate x (t + 1) in any t
//     seconds).
//
//   - eta: the wait estimate's error, from the spike's joins: every tenth
//     joiner watches its events stream until it is admitted; its wait
//     (from the join's answer to the admitted event) against the
//     `eta_seconds` that answer gave.
//
//     go run ./loadtest/roomload -base http://127.0.0.1:18090 -admin <token> -tokens tokens.txt -pid <server pid> -redis 127.0.0.1:16390
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
	"math"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "roomload:", err)
		os.Exit(1)
	}
}

type config struct {
	base, admin      string
	tokens           []string
	pid              int
	rdb              *redis.Client
	streams          int
	rate             int
	spikeFor         time.Duration
	calmFor          time.Duration
	sample           int
	client, streamer *http.Client
}

func run() error {
	var c config
	var tokensPath, redisAddr string
	var redisDB int
	flag.StringVar(&c.base, "base", "http://127.0.0.1:18090", "server base URL")
	flag.StringVar(&c.admin, "admin", "", "admin token (creates the vouchers)")
	flag.StringVar(&tokensPath, "tokens", "", "users' tokens, one per line (loadtest/tokens)")
	flag.IntVar(&c.pid, "pid", 0, "the server's process ID, to read its CPU time")
	flag.StringVar(&redisAddr, "redis", "127.0.0.1:6379", "the server's Redis (its commands and CPU are read from INFO: give the server a Redis of its own)")
	flag.IntVar(&redisDB, "db", 0, "the server's Redis logical database")
	flag.IntVar(&c.streams, "streams", 2000, "waiters with an events stream open, in the streams step")
	flag.IntVar(&c.rate, "rate", 200, "the spike step's room admits this many a second; joins arrive at it, then at 10x it")
	flag.DurationVar(&c.calmFor, "calm", 8*time.Second, "joins at the room's rate before and after the spike, each")
	flag.DurationVar(&c.spikeFor, "spike", 4*time.Second, "joins at 10x the room's rate for this long")
	flag.IntVar(&c.sample, "sample", 10, "every sample-th joiner of the spike step watches its events stream, for the wait estimate's error")
	steps := flag.String("steps", "streams,spike", "steps to run")
	flag.Parse()
	if c.admin == "" || tokensPath == "" || c.pid <= 0 {
		return errors.New("-admin, -tokens and -pid are required")
	}
	if c.streams <= 0 || c.rate <= 0 || c.sample <= 0 || c.spikeFor <= 0 || c.calmFor <= 0 {
		return errors.New("-streams, -rate, -sample, -spike and -calm must be positive")
	}
	data, err := os.ReadFile(tokensPath)
	if err != nil {
		return err
	}
	c.tokens = strings.Fields(string(data))
	c.rdb = redis.NewClient(&redis.Options{Addr: redisAddr, DB: redisDB})
	defer c.rdb.Close()
	c.client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	// Streams each keep a connection for as long as they run.
	c.streamer = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1, DisableKeepAlives: true}}

	next := 0 // tokens are used once each, across the steps
	for _, step := range strings.Split(*steps, ",") {
		switch step {
		case "streams":
			if next+c.streams > len(c.tokens) {
				return fmt.Errorf("streams: %d tokens needed, %d left", c.streams, len(c.tokens)-next)
			}
			if err := c.streamsStep(c.tokens[next : next+c.streams]); err != nil {
				return fmt.Errorf("streams: %w", err)
			}
			next += c.streams
		case "spike":
			if err := c.spikeStep(c.tokens[next:]); err != nil {
				return fmt.Errorf("spike: %w", err)
			}
		default:
			return fmt.Errorf("unknown step %q", step)
		}
	}
	return nil
}

// roomVoucher creates a voucher with a room that admits rate a second and
// whose sale began a minute ago (joins are numbered as they come).
func (c *config) roomVoucher(title string, rate int) (int64, error) {
	now := time.Now().UTC()
	body, _ := json.Marshal(map[string]any{
		"title": title, "stock": 10_000_000,
		"begin_time": now.Add(-time.Minute), "end_time": now.Add(6 * time.Hour),
		// opens_at defaults to begin_time, since that is before the
		// voucher's creation.
		"room": map[string]any{"admit_per_second": rate, "hold_for": 60},
	})
	var v struct {
		ID string `json:"id"`
	}
	if err := c.do(http.MethodPost, "/vouchers", c.admin, body, &v); err != nil {
		return 0, err
	}
	return strconv.ParseInt(v.ID, 10, 64)
}

func (c *config) do(method, path, token string, body []byte, out any) error {
	req, _ := http.NewRequest(method, c.base+path, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, b)
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

// place is the room's answer to a join and each event's data.
type place struct {
	State      string `json:"state"`
	Number     string `json:"number"`
	Ahead      *int64 `json:"ahead"`
	ETASeconds *int64 `json:"eta_seconds"`
}

func (c *config) join(id int64, token string) (place, error) {
	var p place
	err := c.do(http.MethodPost, fmt.Sprintf("/vouchers/%d/room", id), token, nil, &p)
	return p, err
}

// joinAll joins every token to the room, 64 at a time.
func (c *config) joinAll(id int64, tokens []string) error {
	var wg sync.WaitGroup
	var failed atomic.Value
	work := make(chan string)
	for range 64 {
		wg.Go(func() {
			for t := range work {
				if _, err := c.join(id, t); err != nil {
					failed.Store(err)
				}
			}
		})
	}
	for _, t := range tokens {
		work <- t
	}
	close(work)
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		return err
	}
	return nil
}

// watch reads a room's events stream until ctx ends or until an event
// with state admitted when untilAdmitted; it calls onEvent (if not nil) at
// each event and reports when admitted came and how many events.
func (c *config) watch(ctx context.Context, id int64, token string, untilAdmitted bool, onEvent func()) (time.Time, int, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/vouchers/%d/room/events", c.base, id), nil)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := c.streamer.Do(req)
	if err != nil {
		return time.Time{}, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return time.Time{}, 0, fmt.Errorf("events: %d %s", resp.StatusCode, b)
	}
	sc := bufio.NewScanner(resp.Body)
	events := 0
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if events++; onEvent != nil {
			onEvent()
		}
		var p place
		if json.Unmarshal([]byte(line), &p) == nil && p.State == "admitted" && untilAdmitted {
			return time.Now(), events, nil
		}
	}
	if ctx.Err() != nil {
		return time.Time{}, events, nil
	}
	return time.Time{}, events, fmt.Errorf("events stream ended: %v", sc.Err())
}

// usage is what the server and Redis have used up to a moment.
type usage struct {
	at         time.Time
	serverCPU  time.Duration
	redisCPU   time.Duration
	redisCalls int64 // commands, those of scripts included
	scripts    int64 // EVALSHA and EVAL calls: round trips of the room's scripts
}

func (c *config) usage(ctx context.Context) (usage, error) {
	u := usage{at: time.Now()}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.pid))
	if err != nil {
		return u, err
	}
	// Fields after the command's closing parenthesis: utime and stime are
	// the 14th and 15th of the whole line.
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	u.serverCPU = time.Duration(ut+st) * 10 * time.Millisecond // CLK_TCK 100
	info, err := c.rdb.Info(ctx, "stats", "cpu", "commandstats").Result()
	if err != nil {
		return u, err
	}
	for line := range strings.SplitSeq(info, "\r\n") {
		k, v, _ := strings.Cut(line, ":")
		switch k {
		case "total_commands_processed":
			u.redisCalls, _ = strconv.ParseInt(v, 10, 64)
		case "cmdstat_evalsha", "cmdstat_eval", "cmdstat_evalsha_ro", "cmdstat_eval_ro":
			calls, _, _ := strings.Cut(strings.TrimPrefix(v, "calls="), ",")
			n, _ := strconv.ParseInt(calls, 10, 64)
			u.scripts += n
		case "used_cpu_sys", "used_cpu_user":
			s, _ := strconv.ParseFloat(v, 64)
			u.redisCPU += time.Duration(s * float64(time.Second))
		}
	}
	return u, nil
}

// perSecond is what was used a second between two usages: CPU in ms,
// Redis' commands and script calls.
type perSecond struct{ server, redis, calls, scripts float64 }

func (c *config) measure(ctx context.Context, d time.Duration) (perSecond, error) {
	a, err := c.usage(ctx)
	if err != nil {
		return perSecond{}, err
	}
	time.Sleep(d)
	b, err := c.usage(ctx)
	if err != nil {
		return perSecond{}, err
	}
	s := b.at.Sub(a.at).Seconds()
	return perSecond{
		server: float64(b.serverCPU-a.serverCPU) / 1e6 / s, redis: float64(b.redisCPU-a.redisCPU) / 1e6 / s,
		calls: float64(b.redisCalls-a.redisCalls) / s, scripts: float64(b.scripts-a.scripts) / s,
	}, nil
}

func (c *config) streamsStep(tokens []string) error {
	ctx := context.Background()
	id, err := c.roomVoucher("roomload: streams", 1)
	if err != nil {
		return err
	}
	if err := c.joinAll(id, tokens); err != nil {
		return err
	}
	fmt.Printf("streams: %d waiters joined voucher %d, which admits 1 a second\n", len(tokens), id)
	const window = 10 * time.Second
	time.Sleep(2 * time.Second)
	p0, err := c.measure(ctx, window)
	if err != nil {
		return err
	}
	sctx, stop := context.WithCancel(ctx)
	var opened sync.WaitGroup
	opened.Add(len(tokens))
	var wg sync.WaitGroup
	var events atomic.Int64
	var failures atomic.Int64
	for _, t := range tokens {
		wg.Go(func() {
			once := sync.OnceFunc(opened.Done)
			defer once()
			_, _, err := c.watch(sctx, id, t, false, func() { once(); events.Add(1) })
			if err != nil {
				if failures.Add(1) == 1 {
					fmt.Println("streams: the first stream that failed:", err)
				}
			}
		})
	}
	opened.Wait()
	time.Sleep(2 * time.Second)
	e0 := events.Load()
	p1, err := c.measure(ctx, window)
	e1 := events.Load()
	stop()
	wg.Wait()
	if err != nil {
		return err
	}
	k := float64(len(tokens)) / 1000
	fmt.Printf("streams: without streams   server %6.1f ms CPU/s   redis %6.2f ms CPU/s %7.1f scripts/s %8.1f commands/s\n", p0.server, p0.redis, p0.scripts, p0.calls)
	fmt.Printf("streams: %5d streams     server %6.1f ms CPU/s   redis %6.2f ms CPU/s %7.1f scripts/s %8.1f commands/s   %6.0f events/s   (%d streams failed)\n",
		len(tokens), p1.server, p1.redis, p1.scripts, p1.calls, float64(e1-e0)/window.Seconds(), failures.Load())
	fmt.Printf("streams: per 1000 waiters server %6.1f ms CPU/s   redis %6.2f ms CPU/s %7.1f scripts/s %8.1f commands/s\n",
		(p1.server-p0.server)/k, (p1.redis-p0.redis)/k, (p1.scripts-p0.scripts)/k, (p1.calls-p0.calls)/k)
	return nil
}

// q is the p-quantile of xs (nearest rank), 0 when empty.
func q(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}
