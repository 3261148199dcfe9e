package main

import (
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

func TestLoadConfig(t *testing.T) {
	real := map[string]string{
		"MYSQL_DSN":  "root:@tcp(127.0.0.1:3306)/seckill",
		"REDIS_ADDR": "127.0.0.1:6379",
		"JWT_SECRET": "0123456789abcdef",
	}
	with := func(base map[string]string, kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	tests := []struct {
		name    string
		env     map[string]string
		wantErr string // "" for none
	}{
		{"embedded", map[string]string{}, ""},
		{"real stack", real, ""},
		{"no JWT_SECRET with MySQL and Redis", with(real, "JWT_SECRET", ""), "JWT_SECRET must be set"},
		{"short JWT_SECRET", with(real, "JWT_SECRET", "short"), "JWT_SECRET must be set"},
		{"only MYSQL_DSN", map[string]string{"MYSQL_DSN": real["MYSQL_DSN"], "JWT_SECRET": "0123456789abcdef"}, "set both MYSQL_DSN and REDIS_ADDR"},
		{"bad DSN", with(real, "MYSQL_DSN", "not a dsn"), "MYSQL_DSN is not a valid"},
		{"bad mode", with(real, "SECKILL_MODE", "fast"), "SECKILL_MODE"},
		{"bad lock backend", with(real, "LOCK_BACKEND", "zk"), "LOCK_BACKEND"},
		{"redlock without nodes", with(real, "LOCK_BACKEND", "redlock"), "REDLOCK_ADDRS"},
		{"bad number", with(real, "REDIS_DB", "x"), "REDIS_DB"},
		{"bad duration", with(real, "STOCK_HOLD", "soon"), "STOCK_HOLD"},
		{"hold too short", with(real, "STOCK_HOLD", "1s"), "STOCK_HOLD"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadConfig(func(k string) string { return tc.env[k] })
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("error %v, want one saying %q", err, tc.wantErr)
			}
		})
	}

	t.Run("defaults", func(t *testing.T) {
		c, err := loadConfig(func(k string) string { return real[k] })
		if err != nil {
			t.Fatal(err)
		}
		if c.DevCodes || len(c.AdminPhones) != 0 || c.Mode != "sync" || c.LockBackend != "redis" || c.HTTPAddr != ":8080" {
			t.Errorf("real-stack defaults: %+v", c)
		}
		if d, err := mysql.ParseDSN(c.MySQLDSN); err != nil || !d.ParseTime || d.Loc != time.UTC {
			t.Errorf("DSN not normalised to parseTime=true, loc=UTC: %s", c.MySQLDSN)
		}
		e, err := loadConfig(func(string) string { return "" })
		if err != nil {
			t.Fatal(err)
		}
		if !e.DevCodes || len(e.AdminPhones) != 1 || e.AdminPhones[0] != "13800000000" || len(e.JWTSecret) < 16 {
			t.Errorf("embedded defaults: %+v", e)
		}
	})
}

// The server runs its per-user lock on RedLock over three redis-server
// processes of the test's own, and sells exactly its stock.
func TestSaleWithRedLockBackend(t *testing.T) {
	st := newStack(t, 0)
	var addrs []string
	for range 3 {
		addr, _ := privateRedis(t)
		addrs = append(addrs, addr)
	}
	insts := startMany(t, st, 2, "LOCK_BACKEND", "redlock", "REDLOCK_ADDRS", strings.Join(addrs, ","))
	admin, _ := mustLogin(t, insts[0].Base, adminPhone)
	vid := openVoucher(t, insts[0].Base, admin, 20)
	users := loginMany(t, insts[0].Base, 60)
	var l ledger
	rush(&l, insts, users, vid, 2)
	onlyExpected(t, &l, "sold_out", "already_ordered")
	if won := l.wins(t); len(won) != 20 {
		t.Errorf("%d won, want 20", len(won))
	}
}
