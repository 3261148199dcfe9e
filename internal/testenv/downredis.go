package testenv

import (
	"context"
	"errors"
	"net"
	"testing"

	"github.com/redis/go-redis/v9"
)

// ErrRedisDown is what every command to DownRedis fails with.
var ErrRedisDown = errors.New("redis is down (test stand-in)")

// DownRedis returns a client whose every command fails at once with
// ErrRedisDown, without dialling anything. It is for fuzz targets, which
// must run without servers and thousands of times a second: a body the
// service takes then shows as the Redis failure it runs into. Anything
// that must prove behaviour against Redis uses a real server.
func DownRedis(tb testing.TB) *redis.Client {
	tb.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: "redis.invalid:6379"})
	rdb.AddHook(down{})
	tb.Cleanup(func() { rdb.Close() })
	return rdb
}

type down struct{}

func (down) DialHook(redis.DialHook) redis.DialHook {
	return func(context.Context, string, string) (net.Conn, error) { return nil, ErrRedisDown }
}

func (down) ProcessHook(redis.ProcessHook) redis.ProcessHook {
	return func(_ context.Context, cmd redis.Cmder) error {
		cmd.SetErr(ErrRedisDown)
		return ErrRedisDown
	}
}

func (down) ProcessPipelineHook(redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(_ context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			cmd.SetErr(ErrRedisDown)
		}
		return ErrRedisDown
	}
}
