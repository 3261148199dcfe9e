package autopipe_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/autopipe"
	"seckill/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// attach puts a Pipeliner on a client of srv, closed when the test ends.
func attach(t *testing.T, srv *testenv.RedisServer, senders int) (*redis.Client, *autopipe.Pipeliner) {
	t.Helper()
	rdb := srv.Client(t)
	p, err := autopipe.Attach(rdb, senders, 128)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close) // runs before the client's Close, registered earlier
	return rdb, p
}

// sent is a hook added after the Pipeliner's: it sees a command when it
// leaves alone (from a sender, or straight from its caller), and tells
// on the channel of its name.
type sent map[string]chan struct{}

func (s sent) DialHook(next redis.DialHook) redis.DialHook { return next }
func (s sent) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (s sent) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if ch, ok := s[cmd.Name()]; ok {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
		return next(ctx, cmd)
	}
}

func watch(rdb *redis.Client, names ...string) sent {
	s := sent{}
	for _, n := range names {
		s[n] = make(chan struct{}, 1)
	}
	rdb.AddHook(s)
	return s
}

// incr is a script, so that the test covers EVALSHA's first run on a
// server that does not know it yet (NOSCRIPT, then EVAL) inside batches.
var incr = redis.NewScript(`return redis.call('INCRBY', KEYS[1], ARGV[1])`)

// 300 goroutines released at once each run a script, a SET and a GET on
// keys of their own, on a server that does not know the script yet: every
// one gets its own replies (the script's EVALSHA fails NOSCRIPT in a batch
// and Script.Run falls back on EVAL), and the commands shared round trips.
func TestConcurrentCommandsShareRoundTrips(t *testing.T) {
	srv := testenv.StartRedis(t)
	rdb, p := attach(t, srv, 2)
	ctx := context.Background()
	const n = 300
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-gate
			key := "k" + strconv.Itoa(i)
			if v, err := incr.Run(ctx, rdb, []string{key}, i).Int(); err != nil || v != i {
				t.Errorf("script on %s: %d %v, want %d", key, v, err, i)
			}
			if err := rdb.Set(ctx, key+":s", i, 0).Err(); err != nil {
				t.Error(err)
			}
			if v, err := rdb.Get(ctx, key+":s").Int(); err != nil || v != i {
				t.Errorf("get %s: %d %v, want %d", key, v, err, i)
			}
		})
	}
	close(gate)
	wg.Wait()
	batches, commands := p.Stats()
	t.Logf("%d commands in %d round trips", commands, batches)
	if commands <= 3*n {
		t.Fatalf("%d commands passed the senders, want more than %d: some EVALSHA must have met NOSCRIPT and been sent again as EVAL", commands, 3*n)
	}
	if batches >= commands {
		t.Errorf("%d commands in %d round trips: none shared one", commands, batches)
	}
}

// A blocking read goes alone: while it waits on the server, the other
// commands of the client go on being answered.
func TestBlockingCommandsGoAlone(t *testing.T) {
	srv := testenv.StartRedis(t)
	rdb, _ := attach(t, srv, 1)
	direct := srv.Client(t)
	out := watch(rdb, "xread")
	ctx := context.Background()
	// The block is far longer than the bound on the INCRs: behind it, they
	// would take 10s. An XADD ends it once they are done.
	read := make(chan error, 1)
	go func() {
		_, err := rdb.XRead(ctx, &redis.XReadArgs{Streams: []string{"s", "$"}, Block: 10 * time.Second}).Result()
		read <- err
	}()
	<-out["xread"]
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(direct.Info(ctx, "clients").Val(), "blocked_clients:1") {
		if time.Now().After(deadline) {
			t.Fatal("the XREAD is not blocked on the server 5s after it left")
		}
		time.Sleep(10 * time.Millisecond)
	}
	start := time.Now()
	for range 20 {
		if err := rdb.Incr(ctx, "n").Err(); err != nil {
			t.Fatal(err)
		}
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("20 INCRs took %v beside a blocked XREAD", d)
	}
	select {
	case err := <-read:
		t.Fatalf("the XREAD ended before its block did: %v", err)
	default:
	}
	if err := direct.XAdd(ctx, &redis.XAddArgs{Stream: "s", Values: []string{"k", "v"}}).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-read:
		if err != nil {
			t.Fatalf("XREAD: %v, want the entry added", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the XREAD did not end 5s after an entry was added")
	}
}

// A caller whose context ends while every sender is busy leaves without
// its command ever being sent.
//
// The sender stays busy until the test has seen the caller leave: its
// script spins until SCRIPT KILL, not for a set time, so a loaded machine
// that is slow to reach the INCR cannot find the sender free. (It spun for
// 500 ms before, which a stalled test could outlast.) The server answers
// SCRIPT KILL once a script has run for lua-time-limit, here 100 ms.
func TestContextEndsBeforeSending(t *testing.T) {
	srv := testenv.StartRedis(t, "--lua-time-limit", "100")
	rdb, _ := attach(t, srv, 1)
	direct := srv.Client(t)
	out := watch(rdb, "eval")
	ctx := context.Background()
	// Until killed, or 30 s should the kill never come.
	spin := redis.NewScript(`local t = redis.call('TIME'); local s = tonumber(t[1])
while true do t = redis.call('TIME'); if tonumber(t[1]) - s > 30 then return 1 end end`)
	busy := make(chan error, 1)
	go func() { busy <- spin.Eval(ctx, rdb, []string{"x"}).Err() }()
	<-out["eval"] // the sender is sending it
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := rdb.Incr(short, "never").Err(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("INCR with the sender busy: %v, want the deadline", err)
	}
	// NOTBUSY: the script has not started yet, or not run for 100 ms.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		err := direct.ScriptKill(ctx).Err()
		if err == nil {
			break
		}
		if !strings.Contains(err.Error(), "NOTBUSY") || time.Now().After(deadline) {
			t.Fatalf("SCRIPT KILL: %v", err)
		}
	}
	if err := <-busy; err == nil {
		t.Fatal("the script ended on its own, not killed")
	}
	if v, err := direct.Get(ctx, "never").Result(); !errors.Is(err, redis.Nil) {
		t.Fatalf("the abandoned INCR ran: %q %v", v, err)
	}
}

// When the server dies under load, every caller gets an error and none
// waits forever; after Close, commands go alone.
func TestServerDiesUnderLoad(t *testing.T) {
	srv := testenv.StartRedis(t)
	rdb, p := attach(t, srv, 2)
	ctx := context.Background()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	failed := 0
	for i := range 50 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := rdb.Incr(ctx, "k"+strconv.Itoa(i)).Err(); err != nil {
					mu.Lock()
					failed++
					mu.Unlock()
					return
				}
			}
		})
	}
	time.Sleep(200 * time.Millisecond)
	srv.Kill()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		close(stop)
		t.Fatal("callers still waiting 10 s after the server died")
	}
	if failed != 50 {
		t.Errorf("%d of 50 callers saw an error", failed)
	}

	srv.Restart(t)
	p.Close()
	if err := rdb.Set(ctx, "after", 1, 0).Err(); err != nil {
		t.Fatalf("a command after Close: %v", err)
	}
	if b, c := p.Stats(); b == 0 || c == 0 {
		t.Errorf("stats %d/%d", b, c)
	}
}

// A client that retries is refused: go-redis retries a pipeline whole.
func TestRetryingClientRefused(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: testenv.StartRedis(t).Addr()}) // MaxRetries: go-redis' default 3
	t.Cleanup(func() { rdb.Close() })
	if _, err := autopipe.Attach(rdb, 1, 8); err == nil {
		t.Fatal("attached to a client that retries")
	}
}

// panicky panics when go-redis writes it.
type panicky struct{}

func (panicky) MarshalBinary() ([]byte, error) { panic("marshal") }

// bad fails when go-redis writes it.
type bad struct{}

func (bad) MarshalBinary() ([]byte, error) { return nil, errors.New("cannot marshal") }

// An argument that is not a plain value goes alone: its failure to encode
// fails its own command, not the others of a batch; and a panic while it
// is written reaches its caller's goroutine, not a sender's (where nothing
// would recover it and the process would die).
func TestOddArgumentsGoAlone(t *testing.T) {
	srv := testenv.StartRedis(t)
	rdb, _ := attach(t, srv, 1)
	ctx := context.Background()
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Go(func() {
			<-gate
			if i%10 == 0 {
				if err := rdb.Set(ctx, "bad", bad{}, 0).Err(); err == nil {
					t.Error("SET of a value that cannot be written succeeded")
				}
				return
			}
			if err := rdb.Incr(ctx, "n"+strconv.Itoa(i)).Err(); err != nil {
				t.Errorf("INCR beside a bad SET: %v", err)
			}
		})
	}
	close(gate)
	wg.Wait()

	defer func() {
		if r := recover(); r != "marshal" {
			t.Fatalf("recovered %v, want the panic of MarshalBinary on the caller's goroutine", r)
		}
	}()
	rdb.Set(ctx, "p", panicky{}, 0)
}

// Close while hundreds of callers are sending: every command gets its
// reply (none is left waiting for a sender that has gone), none runs
// twice. Each round releases 200 callers at once, five INCRs each on a key
// of their own, and closes the Pipeliner a little later each round, so
// that Close meets many commands waiting, a few, or none; the senders'
// batches are small, so more than a batch waits when Close comes. (It
// caught a queue for the senders that Close shut after stopping them.)
func TestCloseWhileSending(t *testing.T) {
	srv := testenv.StartRedis(t)
	ctx := context.Background()
	const rounds, callers, incrs = 30, 200, 5
	midway := 0 // rounds where Close came after some commands went through the senders and before all did
	for round := range rounds {
		rdb := srv.Client(t)
		p, err := autopipe.Attach(rdb, 1+round%3, 8)
		if err != nil {
			t.Fatal(err)
		}
		gate := make(chan struct{})
		var wg sync.WaitGroup
		for i := range callers {
			wg.Go(func() {
				<-gate
				key := "r" + strconv.Itoa(round) + ":" + strconv.Itoa(i)
				for j := 1; j <= incrs; j++ {
					if v, err := rdb.Incr(ctx, key).Result(); err != nil || v != int64(j) {
						t.Errorf("INCR %s: %d %v, want %d", key, v, err, j)
						return
					}
				}
			})
		}
		closed := make(chan struct{})
		go func() {
			<-gate
			time.Sleep(time.Duration(round%10) * 300 * time.Microsecond)
			p.Close()
			close(closed)
		}()
		close(gate)
		done := make(chan struct{})
		go func() { wg.Wait(); <-closed; close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Fatalf("round %d: callers or Close still waiting 20 s after Close began: a command stranded", round)
		}
		if _, c := p.Stats(); c > 0 && c < callers*incrs {
			midway++
		}
	}
	t.Logf("Close came midway in %d of %d rounds", midway, rounds)
	if midway == 0 {
		t.Error("Close never came while commands were going through the senders: the test did not test")
	}
}

// Callers whose contexts end at random moments, many at once: one told
// its context ended never had its command run, one answered had it run
// once. It checks the race between a caller giving up on its command and
// a sender taking it to send: both must not win.
func TestContextsEndAtRandom(t *testing.T) {
	srv := testenv.StartRedis(t)
	rdb, p := attach(t, srv, 1)
	direct := srv.Client(t)
	ctx := context.Background()
	const callers = 64
	var answered, gaveUp [callers]int64
	end := time.Now().Add(500 * time.Millisecond)
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			<-gate
			key := "c" + strconv.Itoa(i)
			for n := 0; time.Now().Before(end); n++ {
				// From no time at all to about a round trip with a batch.
				short, cancel := context.WithTimeout(ctx, time.Duration(n%13)*25*time.Microsecond)
				err := rdb.Incr(short, key).Err()
				cancel()
				switch {
				case err == nil:
					answered[i]++
				case errors.Is(err, context.DeadlineExceeded):
					gaveUp[i]++
				default:
					t.Errorf("INCR %s: %v", key, err)
					return
				}
			}
		})
	}
	close(gate)
	wg.Wait()
	var a, g int64
	for i := range callers {
		a, g = a+answered[i], g+gaveUp[i]
		key := "c" + strconv.Itoa(i)
		v, err := direct.Get(ctx, key).Int64()
		if errors.Is(err, redis.Nil) {
			v, err = 0, nil
		}
		if err != nil || v != answered[i] {
			t.Errorf("%s is %d (%v), want %d: its caller was answered %d times and gave up %d", key, v, err, answered[i], answered[i], gaveUp[i])
		}
	}
	b, c := p.Stats()
	t.Logf("%d answered, %d gave up; %d commands in %d round trips", a, g, c, b)
	if a == 0 || g == 0 {
		t.Errorf("%d answered, %d gave up: want both", a, g)
	}
}
