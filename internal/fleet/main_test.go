package fleet

import (
	"testing"

	"seckill/internal/testenv"
)

// TestMain fails the package's tests if any of them leaves a goroutine
// behind (testenv.Main: goleak).
func TestMain(m *testing.M) { testenv.Main(m) }
