// Command yardstick is the measure the server's reject path is held to: the
// least a Go service can do to answer POST /seckill/{voucherId} from Redis.
//
// It runs gin with no middleware and one route whose handler runs ONE
// EVALSHA of a stock script shaped like internal/stock/take.lua (GET the
// stock, compare, DECR) and answers JSON. It receives the same
// Authorization header as the server but does not verify it, reads no
// voucher, takes no lock and writes no order: whatever the real server
// spends beyond this is the price of its checks.
//
//	go run ./loadtest/yardstick -addr 127.0.0.1:8081 -redis 127.0.0.1:6379 -db 5
//
// Its stock key is yardstick:{v<ID>}:stock, apart from the server's keys;
// loadtest/reject.sh sets it to 0 so that every request is a reject.
//
// With -constant it does not even ask Redis: every request is answered
// 409 sold_out from a constant, the least gin itself costs. That is the
// yardstick of the sold-out path once the server answers it from memory
// (YARD=constant loadtest/reject.sh).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"
)

// takeSrc has take.lua's shape without the buyer set and the hold: the
// stock check and the decrement that every request of a sale needs.
const takeSrc = `
local stock = redis.call('GET', KEYS[1])
if not stock then
  return 3
end
if tonumber(stock) <= 0 then
  return 1
end
redis.call('DECR', KEYS[1])
return 0
`

// The script's return codes.
const (
	taken   = 0
	soldOut = 1
	missing = 3
)

var takeScript = redis.NewScript(takeSrc)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "yardstick:", err)
		os.Exit(1)
	}
}

func run() error {
	addr := flag.String("addr", "127.0.0.1:8081", "listen address")
	redisAddr := flag.String("redis", "127.0.0.1:6379", "Redis host:port")
	db := flag.Int("db", 5, "Redis logical database")
	pool := flag.Int("pool", 64, "Redis pool size (the server's REDIS_POOL_SIZE default)")
	constant := flag.Bool("constant", false, "answer every request 409 sold_out without Redis")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	rdb := redis.NewClient(&redis.Options{Addr: *redisAddr, DB: *db, PoolSize: *pool})
	defer rdb.Close()
	if err := takeScript.Load(ctx, rdb).Err(); err != nil {
		return fmt.Errorf("load script: %w", err)
	}

	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	if *constant {
		r.POST("/seckill/:voucherId", func(c *gin.Context) {
			c.JSON(http.StatusConflict, gin.H{"error": gin.H{"code": "sold_out", "message": "sold out"}})
		})
		return serve(ctx, r, *addr, "constant 409, no redis")
	}
	r.POST("/seckill/:voucherId", func(c *gin.Context) {
		id, err := strconv.ParseInt(c.Param("voucherId"), 10, 64)
		if err != nil || id <= 0 {
			c.JSON(http.StatusBadRequest, gin.H{"error": gin.H{"code": "invalid_argument", "message": "bad voucher ID"}})
			return
		}
		_ = c.GetHeader("Authorization") // received, not verified
		key := "yardstick:{v" + strconv.FormatInt(id, 10) + "}:stock"
		code, err := rdb.EvalSha(c.Request.Context(), takeScript.Hash(), []string{key}).Int()
		switch {
		case err != nil:
			c.JSON(http.StatusServiceUnavailable, gin.H{"error": gin.H{"code": "unavailable", "message": "redis"}})
		case code == taken:
			c.JSON(http.StatusOK, gin.H{"order_id": "0"})
		case code == soldOut:
			c.JSON(http.StatusConflict, gin.H{"error": gin.H{"code": "sold_out", "message": "sold out"}})
		case code == missing:
			c.JSON(http.StatusNotFound, gin.H{"error": gin.H{"code": "not_found", "message": "no stock key"}})
		default:
			c.JSON(http.StatusInternalServerError, gin.H{"error": gin.H{"code": "internal", "message": "internal error"}})
		}
	})

	return serve(ctx, r, *addr, fmt.Sprintf("redis %s db %d", *redisAddr, *db))
}

// serve runs h on addr until ctx ends.
func serve(ctx context.Context, h http.Handler, addr, what string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Printf("yardstick listening on %s (%s)", ln.Addr(), what)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shut); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
