//go:build !linux

package testenv

import "syscall"

// sysProcAttr has nothing to add outside Linux: there a server outlives a
// test binary that dies without running its cleanups.
func sysProcAttr() *syscall.SysProcAttr { return nil }
