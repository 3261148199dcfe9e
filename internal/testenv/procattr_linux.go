package testenv

import "syscall"

// sysProcAttr makes the kernel kill a server when the test binary dies
// without running its cleanups (a panic, a -timeout, a SIGKILL), so no
// orphan keeps a port and a data directory.
//
// Pdeathsig follows the OS thread that started the server, not the
// process; the Go runtime does not end its threads in practice, and the
// cleanups remain the first line.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
