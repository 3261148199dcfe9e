package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Experiments 12 and 12b (failover, redlock-restart) need what miniredis
// cannot play: replication, and servers that die and come back empty.
// They run real redis-server processes of the lab's own, on free ports of
// 127.0.0.1, keeping nothing on disk, stopped when the experiment ends.

// quietRedis drops go-redis' own log lines ("failed to dial"): the lab
// kills servers on purpose, and says so in its report.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

func init() { redis.SetLogger(quietRedis{}) }

// errNoRedisServer says why an experiment that needs a real Redis cannot
// run.
var errNoRedisServer = errors.New("needs redis-server on PATH (Debian: apt-get install redis-server)")

// lookPath finds redis-server. The tests replace it to leave the
// experiments that start servers out of a run of unit tests.
var lookPath = exec.LookPath

// redisProc is one redis-server of the lab's own.
type redisProc struct {
	bin  string
	args []string
	port int
	dir  string
	cmd  *exec.Cmd
	rdb  *redis.Client
}

// startRedis starts an empty redis-server with args added to its command
// line, and a client of it that never retries (a retry could run a lock
// command twice).
func startRedis(ctx context.Context, args ...string) (*redisProc, error) {
	bin, err := lookPath("redis-server")
	if err != nil {
		return nil, errNoRedisServer
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir, err := os.MkdirTemp("", "seckill-lab-redis-")
	if err != nil {
		return nil, err
	}
	p := &redisProc{bin: bin, args: args, port: port, dir: dir}
	// One dial attempt: a dead server must fail fast, and the experiments
	// kill servers on purpose.
	p.rdb = redis.NewClient(&redis.Options{Addr: p.addr(), MaxRetries: -1, DialerRetries: 1, DialTimeout: 500 * time.Millisecond,
		ContextTimeoutEnabled: true}) // as lock.NewRedLock asks
	if err := p.start(ctx); err != nil {
		p.close()
		return nil, err
	}
	return p, nil
}

func (p *redisProc) addr() string { return "127.0.0.1:" + strconv.Itoa(p.port) }

func (p *redisProc) start(ctx context.Context) error {
	args := append([]string{"--port", strconv.Itoa(p.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", p.dir}, p.args...)
	p.cmd = exec.Command(p.bin, args...)
	if err := p.cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for p.rdb.Ping(ctx).Err() != nil {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("redis-server on %s did not answer within 10s", p.addr())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// kill stops the server at once (SIGKILL), as a crash would: what it held
// in memory is gone.
func (p *redisProc) kill() {
	if p.cmd != nil && p.cmd.Process != nil {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
		p.cmd = nil
	}
}

// restart starts the server again, empty, on the same port: a node that
// crashed and came back without persistence.
func (p *redisProc) restart(ctx context.Context) error {
	p.kill()
	return p.start(ctx)
}

func (p *redisProc) close() {
	_ = p.rdb.Close()
	p.kill()
	_ = os.RemoveAll(p.dir)
}

// startRedises starts n servers, or none.
func startRedises(ctx context.Context, n int) ([]*redisProc, func(), error) {
	var ps []*redisProc
	closeAll := func() {
		for _, p := range ps {
			p.close()
		}
	}
	for range n {
		p, err := startRedis(ctx)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		ps = append(ps, p)
	}
	return ps, closeAll, nil
}
