package testenv

import (
	"context"
	"io"
	"log"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// QuietDrivers silences go-redis' and go-sql-driver's own logging. Tests
// that kill servers, cut connections and drop replies on purpose would
// otherwise bury their output under a line per broken connection; the
// errors still reach the code, which is what the tests look at.
func QuietDrivers() {
	redis.SetLogger(quietLogger{})
	mysql.SetLogger(log.New(io.Discard, "", 0))
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// Main is a TestMain for packages whose goroutines must all be gone when
// their tests are (a lock's watchdog, a proxy's pumps, a server's waiter):
// it runs the tests with QuietDrivers and fails them if a goroutine is
// left. The one exception: go-redis probes a server it failed to dial from
// a goroutine that notices its client was closed only after a 1s sleep.
func Main(m *testing.M) {
	QuietDrivers()
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"),
	)
}
