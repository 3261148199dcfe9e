//go:build !linux

package testenv

import (
	"errors"
	"syscall"
)

// sysProcAttr has nothing to add outside Linux: there a server outlives a
// test binary that dies without running its cleanups.
func sysProcAttr() *syscall.SysProcAttr { return nil }

func (p *process) stop() error { return errors.ErrUnsupported }
func (p *process) cont() error { return errors.ErrUnsupported }
