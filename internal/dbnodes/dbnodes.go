// Package dbnodes lets an instance use MySQL through several nodes of one
// cluster (a MariaDB Galera cluster, where every node takes writes), so
// that the sale goes on when the node it talks to dies.
//
// The server's DSN names one node, the one it prefers; MYSQL_NODES names
// the others, in the order to fall back on them. Nodes registers a
// network of its own with go-sql-driver (RegisterDialContext), and the DSN
// is rewritten to use it: every connection any pool opens from that DSN
// (the service's, the migrations', the tracing driver's) is dialled here,
// to the first node in that order that is up.
//
// "Up" is what a probe found, twice a second, on a connection of its own
// to each node: the node answers, and if it is a Galera node, it is
// Synced in the primary component. A node that is joining (state
// transfer, catching up) answers every statement with error 1047 ("WSREP
// has not yet prepared node for application use"); one cut off from the
// majority does too; a donor of a full copy may block writes. None of
// these takes new connections. Connections already open to a node are treated
// by what happened to it:
//
//   - the node died (SIGKILL, a crash, a reboot): its connections are
//     reset by the kernel, the driver reports them bad, and database/sql
//     drops them and dials again, here, to the next node;
//   - the node answers that it is not Synced: its connections are closed
//     at once, so that no request is sent to a node that can only refuse
//     it (a statement in flight on one fails, as it would have anyway),
//     but for a donor still ready in the majority, which may be serving
//     them (see ready);
//   - the probe gets no answer (a network cut, a node frozen): no new
//     connection goes there, but the open ones are left alone. A slow
//     probe on a loaded machine must not cut healthy connections, each a
//     COMMIT perhaps in flight; a node that is really gone fails them
//     within the DSN's readTimeout.
//
// A dial that fails marks its node down too, until a probe finds it up: a
// host that is gone costs one dial timeout, not one per connection.
package dbnodes

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
)

const (
	// ProbeEvery is how often each node is asked whether it is up.
	ProbeEvery = 500 * time.Millisecond
	// probeTimeout bounds one probe: a node that does not answer within
	// it is taken for down (for new connections only, see above).
	probeTimeout = time.Second
	// dialTimeout bounds one node's share of a dial, so that a node that
	// is gone without a trace (no reset, no refusal) leaves time for the
	// next one within the DSN's timeout.
	dialTimeout = time.Second
)

// Nodes is the set of nodes an instance's MySQL connections go to. It is
// safe for concurrent use.
type Nodes struct {
	net   string   // the network registered with the driver
	addrs []string // in order of preference
	cfg   *mysql.Config
	log   *slog.Logger

	mu    sync.Mutex
	nodes []*node

	stop  context.CancelFunc
	done  sync.WaitGroup
	close sync.Once
}

// node is what is known of one node.
type node struct {
	up    bool  // the last probe or dial found it up (at first: assumed)
	why   error // why it is down
	conns map[*conn]struct{}
	probe *sql.DB
}

// networks numbers the networks registered: several servers may run in
// one process (the tests do), each with its own.
var networks atomic.Int64

// Open starts watching the DSN cfg's node and the others (host:port, in
// order of preference after cfg's own), and returns the Nodes whose
// Config dials them. Close it when the last pool using it is closed.
func Open(cfg *mysql.Config, others []string, log *slog.Logger) (*Nodes, error) {
	if cfg.Net != "tcp" {
		return nil, fmt.Errorf("MYSQL_NODES needs a DSN over tcp(host:port), not %s", cfg.Net)
	}
	addrs := []string{cfg.Addr}
	for _, a := range others {
		if host, port, err := net.SplitHostPort(a); err != nil || host == "" || port == "" {
			return nil, fmt.Errorf("MySQL node %q is not host:port", a)
		}
		if !slices.Contains(addrs, a) {
			addrs = append(addrs, a)
		}
	}
	n := &Nodes{
		net:   fmt.Sprintf("seckill-nodes-%d", networks.Add(1)),
		addrs: addrs,
		cfg:   cfg.Clone(),
		log:   log,
	}
	ctx, stop := context.WithCancel(context.Background())
	n.stop = stop
	for _, addr := range addrs {
		pc := cfg.Clone()
		pc.Addr = addr
		pc.Timeout, pc.ReadTimeout, pc.WriteTimeout = probeTimeout, probeTimeout, probeTimeout
		db, err := sql.Open("mysql", pc.FormatDSN())
		if err != nil {
			stop()
			return nil, err
		}
		db.SetMaxOpenConns(1)
		n.nodes = append(n.nodes, &node{up: true, conns: map[*conn]struct{}{}, probe: db})
	}
	mysql.RegisterDialContext(n.net, n.dial)
	for i := range n.nodes {
		n.done.Go(func() { n.watch(ctx, i) })
	}
	return n, nil
}

// Config returns a copy of the DSN's configuration that dials through
// the nodes: its FormatDSN is the DSN to open pools with.
func (n *Nodes) Config() *mysql.Config {
	c := n.cfg.Clone()
	c.Net = n.net
	return c
}

// Addrs returns the nodes' addresses, in order of preference.
func (n *Nodes) Addrs() []string { return append([]string(nil), n.addrs...) }

// Up reports which nodes are up now, by address.
func (n *Nodes) Up() map[string]bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	up := make(map[string]bool, len(n.nodes))
	for i, nd := range n.nodes {
		up[n.addrs[i]] = nd.up
	}
	return up
}

// Close stops the probes and unregisters the network. Pools still open
// on it can no longer dial.
func (n *Nodes) Close() {
	n.close.Do(func() {
		n.stop()
		n.done.Wait()
		for _, nd := range n.nodes {
			nd.probe.Close()
		}
		mysql.DeregisterDialContext(n.net)
	})
}

// dial opens a connection to the first node that is up, in order of
// preference; when none is, to the first that answers at all, so that the
// caller gets MySQL's own refusal (or finds a node back before its probe
// does).
func (n *Nodes) dial(ctx context.Context, _ string) (net.Conn, error) {
	var errs []error
	for _, i := range n.order() {
		dctx, cancel := context.WithTimeout(ctx, dialTimeout)
		var d net.Dialer
		c, err := d.DialContext(dctx, "tcp", n.addrs[i])
		cancel()
		if err == nil {
			return n.track(i, c.(*net.TCPConn)), nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			// The caller's time ran out (a client that hung up, a
			// deadline), not the node's: it stays as it was.
			break
		}
		n.set(i, false, fmt.Errorf("dial: %w", err), false)
	}
	return nil, errors.Join(errs...)
}

// order is the nodes to try: those up, then those down, each in order of
// preference.
func (n *Nodes) order() []int {
	n.mu.Lock()
	defer n.mu.Unlock()
	var up, down []int
	for i, nd := range n.nodes {
		if nd.up {
			up = append(up, i)
		} else {
			down = append(down, i)
		}
	}
	return append(up, down...)
}

// watch probes node i every ProbeEvery until ctx ends.
func (n *Nodes) watch(ctx context.Context, i int) {
	t := time.NewTicker(ProbeEvery)
	defer t.Stop()
	for {
		up, cut, err := n.probe(ctx, i)
		if ctx.Err() != nil {
			return
		}
		// A node that answered that it cannot serve loses its
		// connections; one that did not answer keeps them, and so does a
		// donor (see the package's doc).
		n.set(i, up, err, cut)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// probe asks node i whether it can serve, and whether its open
// connections must be cut (see ready); never when it could not be asked
// at all.
func (n *Nodes) probe(ctx context.Context, i int) (up, cut bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	rows, err := n.nodes[i].probe.QueryContext(ctx, "SHOW GLOBAL STATUS WHERE Variable_name IN ('wsrep_provider_name', 'wsrep_ready', 'wsrep_local_state_comment', 'wsrep_cluster_status')")
	if err != nil {
		return false, false, err
	}
	defer rows.Close()
	status := map[string]string{}
	for rows.Next() {
		var name, value string
		if err := rows.Scan(&name, &value); err != nil {
			return false, false, err
		}
		status[strings.ToLower(name)] = value
	}
	if err := rows.Err(); err != nil {
		return false, false, err
	}
	return ready(status)
}

// ready reads a node's wsrep status: a node without a provider (MySQL,
// which has no such status, or MariaDB without Galera, which has it, not
// ready and Disconnected) is up; a Galera node is up when it is Synced,
// ready and in the primary component. One that is not gets no new
// connections, and its open ones are cut (it can only refuse them), but
// for a donor that is still ready in the primary component: whether it
// blocks writes depends on the state transfer (rsync does, mariabackup
// and IST do not), and cutting every connection of the node the
// instances prefer, each a COMMIT perhaps in flight, whenever it is
// chosen as a donor would cost more than letting them finish.
func ready(status map[string]string) (up, cut bool, err error) {
	if status["wsrep_provider_name"] == "" {
		return true, false, nil
	}
	state, ready, cluster := status["wsrep_local_state_comment"], status["wsrep_ready"], status["wsrep_cluster_status"]
	if state == "Synced" && ready == "ON" && cluster == "Primary" {
		return true, false, nil
	}
	// Cut only a node that cannot serve at all: a donor, and the same node
	// joined again and catching up (Joined) on its way back to Synced,
	// stay ready in the primary component throughout.
	serving := ready == "ON" && cluster == "Primary"
	return false, !serving, fmt.Errorf("wsrep state %s, ready %s, cluster %s", state, ready, cluster)
}

// Galera reports whether db's server is a node of a Galera cluster:
// MariaDB's wsrep_on is ON. MySQL has no such variable and MariaDB
// without Galera answers OFF: both are false, without an error. What to
// do when it cannot be asked is the caller's choice (the server refuses
// to start with MYSQL_NODES; a sold out's second look treats the server
// as one node).
func Galera(ctx context.Context, db *sql.DB) (bool, error) {
	var name, on string
	err := db.QueryRowContext(ctx, "SHOW GLOBAL VARIABLES LIKE 'wsrep_on'").Scan(&name, &on)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return on == "ON", err
}

// set records what is known of node i, logs a change, and closes its
// connections if cut.
func (n *Nodes) set(i int, up bool, why error, cut bool) {
	n.mu.Lock()
	nd := n.nodes[i]
	changed := nd.up != up
	nd.up, nd.why = up, why
	var conns []*conn
	if cut {
		for c := range nd.conns {
			conns = append(conns, c)
		}
	}
	n.mu.Unlock()
	switch {
	case changed && up:
		n.log.Info("MySQL node up: new connections may go to it", "node", n.addrs[i])
	case changed:
		n.log.Warn("MySQL node down: new connections go to the next node", "node", n.addrs[i], "err", why, "connections_closed", len(conns))
	}
	for _, c := range conns {
		c.Close()
	}
}

// conn is a connection to a node, known to Nodes until it is closed. It
// is a *net.TCPConn, so that the driver's liveness check (which needs
// syscall.Conn) still sees a connection the node reset.
type conn struct {
	*net.TCPConn
	nodes *Nodes
	node  int
	once  sync.Once
}

func (n *Nodes) track(i int, c *net.TCPConn) *conn {
	tc := &conn{TCPConn: c, nodes: n, node: i}
	n.mu.Lock()
	n.nodes[i].conns[tc] = struct{}{}
	n.mu.Unlock()
	return tc
}

// Close closes the connection and forgets it.
func (c *conn) Close() error {
	err := net.ErrClosed
	c.once.Do(func() {
		c.nodes.mu.Lock()
		delete(c.nodes.nodes[c.node].conns, c)
		c.nodes.mu.Unlock()
		err = c.TCPConn.Close()
	})
	return err
}
