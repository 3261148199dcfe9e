//go:build unix

package autopipe_test

import (
	"syscall"
	"time"
)

// processCPU is the CPU time this process has used, user and system: the
// client's side of a benchmark (redis-server is another process).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
