package faultproxy

import (
	"bytes"
	"crypto/sha1"
	"encoding/hex"
	"strconv"
	"strings"
)

// comQuery is the command byte of a MySQL COM_QUERY packet: a plain SQL
// statement, which is how go-sql-driver sends BEGIN, COMMIT and ROLLBACK.
const comQuery = 0x03

// MySQLQuery returns a matcher, for DropReplyAfter, of a chunk that holds a
// MySQL COM_QUERY packet whose SQL text starts with prefix (ignoring case
// and leading white space): MySQLQuery("COMMIT") drops the reply of a
// transaction's commit.
//
// A MySQL packet is a 3-byte little-endian payload length, a sequence
// number, then the payload; a command packet has sequence number 0 and
// starts with its command byte. The matcher walks the chunk packet by
// packet from its start, so it finds the query anywhere in a chunk that
// holds several packets, and only where a packet begins: a query text that
// merely contains "COMMIT" does not match. A packet that runs past the end
// of the chunk does not match either. That never costs a match with
// go-sql-driver, which writes each command in one Write and waits for its
// reply before it writes the next one, so every command starts a chunk.
// Compressed and TLS connections are not understood.
func MySQLQuery(prefix string) func(chunk []byte) bool {
	return func(chunk []byte) bool {
		for len(chunk) >= 4 {
			n := int(chunk[0]) | int(chunk[1])<<8 | int(chunk[2])<<16
			if len(chunk) < 4+n {
				return false
			}
			seq, payload := chunk[3], chunk[4:4+n]
			if seq == 0 && n > 0 && payload[0] == comQuery &&
				hasPrefixFold(bytes.TrimLeft(payload[1:], " \t\r\n"), prefix) {
				return true
			}
			chunk = chunk[4+n:]
		}
		return false
	}
}

// RedisCommand returns a matcher, for DropReplyAfter, of a chunk that holds
// a Redis command named name (ignoring case) whose first arguments are args
// (exactly): RedisCommand("INCR", key), RedisCommand("EVALSHA", sha).
//
// Clients send a command as a RESP array of bulk strings:
// "*3\r\n$4\r\nINCR\r\n$3\r\nkey\r\n" and so on. The matcher parses the
// chunk command by command from its start, so it finds the command anywhere
// in a go-redis pipeline or transaction, which go-redis writes in one
// Write. A command that runs past the end of the chunk does not match, and
// the matcher stops at anything that is not a RESP array (inline commands
// such as redis-cli's are not understood).
func RedisCommand(name string, args ...string) func(chunk []byte) bool {
	return func(chunk []byte) bool {
		for len(chunk) > 0 {
			cmd, rest, ok := parseRESPCommand(chunk)
			if !ok {
				return false
			}
			if commandIs(cmd, name, args) {
				return true
			}
			chunk = rest
		}
		return false
	}
}

// RedisScript returns a matcher of the Lua script src run by EVALSHA (by its
// SHA-1, as go-redis' Script.Run tries first) or by EVAL (its source, the
// fallback after NOSCRIPT). To drop the reply of a script that ran, make
// sure Redis has it loaded (Script.Load) before the fault: otherwise the
// matched EVALSHA fails with NOSCRIPT, which is the only reply dropped.
func RedisScript(src string) func(chunk []byte) bool {
	sum := sha1.Sum([]byte(src))
	bySHA := RedisCommand("EVALSHA", hex.EncodeToString(sum[:]))
	bySource := RedisCommand("EVAL", src)
	return func(chunk []byte) bool { return bySHA(chunk) || bySource(chunk) }
}

// commandIs reports whether cmd is name with args first among its arguments.
func commandIs(cmd [][]byte, name string, args []string) bool {
	if len(cmd) < 1+len(args) || !strings.EqualFold(string(cmd[0]), name) {
		return false
	}
	for i, a := range args {
		if string(cmd[1+i]) != a {
			return false
		}
	}
	return true
}

// parseRESPCommand parses one RESP array of bulk strings from the start of
// b, and returns its elements and what follows it.
func parseRESPCommand(b []byte) (cmd [][]byte, rest []byte, ok bool) {
	n, b, ok := parseRESPHeader(b, '*')
	if !ok || n < 1 {
		return nil, nil, false
	}
	cmd = make([][]byte, 0, min(n, 16))
	for range n {
		var size int
		if size, b, ok = parseRESPHeader(b, '$'); !ok || len(b) < size+2 ||
			b[size] != '\r' || b[size+1] != '\n' {
			return nil, nil, false
		}
		cmd = append(cmd, b[:size])
		b = b[size+2:]
	}
	return cmd, b, true
}

// parseRESPHeader parses a line "<kind><non-negative number>\r\n" at the
// start of b.
func parseRESPHeader(b []byte, kind byte) (n int, rest []byte, ok bool) {
	if len(b) == 0 || b[0] != kind {
		return 0, nil, false
	}
	end := bytes.Index(b, []byte("\r\n"))
	if end < 0 {
		return 0, nil, false
	}
	n, err := strconv.Atoi(string(b[1:end]))
	if err != nil || n < 0 {
		return 0, nil, false
	}
	return n, b[end+2:], true
}

func hasPrefixFold(s []byte, prefix string) bool {
	return len(s) >= len(prefix) && bytes.EqualFold(s[:len(prefix)], []byte(prefix))
}
