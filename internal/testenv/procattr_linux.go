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

// stop and cont freeze and thaw a process (SIGSTOP, SIGCONT): a server
// that stops answering without closing its connections, as a stalled
// machine would.
func (p *process) stop() error { return p.cmd.Process.Signal(syscall.SIGSTOP) }
func (p *process) cont() error { return p.cmd.Process.Signal(syscall.SIGCONT) }
