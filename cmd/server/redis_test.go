package main

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"seckill/internal/testenv"
)

// In production Redis asks who is calling: an ACL user and its password
// (REDIS_USERNAME, REDIS_PASSWORD). The server buys with them, and with a
// wrong password it refuses to start, saying why, instead of serving 503s.
func TestRedisACLUser(t *testing.T) {
	// No default user: a client that does not log in can do nothing.
	srv := testenv.StartRedis(t, "--user", "default", "off", "--user", "seckill", "on", ">s3cret-pass", "~*", "&*", "+@all")
	st := newStack(t, 0)
	env := st.env(freeAddr(t), "REDIS_ADDR", srv.Addr(), "REDIS_DB", "0", "REDIS_USERNAME", "seckill", "REDIS_PASSWORD", "s3cret-pass")
	in := start(t, env)
	admin, _ := mustLogin(t, in.Base, adminPhone)
	vid := openVoucher(t, in.Base, admin, 1)
	buyer := loginMany(t, in.Base, 1)[0]
	if r := mustCall(t, "POST", in.Base+"/seckill/"+vid, buyer.Token, nil); r.Status != http.StatusOK {
		t.Fatalf("buy as ACL user seckill: %d %s", r.Status, r.Raw)
	}

	env = st.env(freeAddr(t), "REDIS_ADDR", srv.Addr(), "REDIS_USERNAME", "seckill", "REDIS_PASSWORD", "wrong", "STARTUP_WAIT", "1s")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var log syncBuffer
	err := run(ctx, func(k string) string { return env[k] }, &log)
	if err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Fatalf("start with a wrong Redis password: %v, want an error naming WRONGPASS", err)
	}
}
