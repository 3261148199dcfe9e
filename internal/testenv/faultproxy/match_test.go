package faultproxy_test

import (
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"slices"
	"testing"

	"seckill/internal/testenv/faultproxy"
)

// mysqlPacket frames payload as a MySQL packet with sequence number seq.
func mysqlPacket(seq byte, payload []byte) []byte {
	n := len(payload)
	return append([]byte{byte(n), byte(n >> 8), byte(n >> 16), seq}, payload...)
}

// comQuery is a COM_QUERY command packet, as a client starts a command.
func comQuery(sql string) []byte { return mysqlPacket(0, append([]byte{0x03}, sql...)) }

func TestMySQLQuery(t *testing.T) {
	twoPackets := slices.Concat(comQuery("SELECT 1"), comQuery("COMMIT"))
	tests := []struct {
		name   string
		prefix string
		chunk  []byte
		want   bool
	}{
		{"the query", "COMMIT", comQuery("COMMIT"), true},
		{"any case", "COMMIT", comQuery("commit"), true},
		{"leading space", "COMMIT", comQuery(" \n COMMIT"), true},
		{"a prefix", "UPDATE vouchers", comQuery("update vouchers SET stock = stock - 1"), true},
		{"second packet of the chunk", "COMMIT", twoPackets, true},
		{"other query", "COMMIT", comQuery("ROLLBACK"), false},
		{"text inside a query", "COMMIT", comQuery("SELECT 'COMMIT'"), false},
		{"not a command packet", "COMMIT", mysqlPacket(1, append([]byte{0x03}, "COMMIT"...)), false},
		{"not COM_QUERY", "COMMIT", mysqlPacket(0, append([]byte{0x16}, "COMMIT"...)), false},
		{"packet cut by the chunk's end", "COMMIT", twoPackets[:len(twoPackets)-1], false},
		{"chunk starting mid-packet", "COMMIT", twoPackets[2:], false},
		{"empty chunk", "COMMIT", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := faultproxy.MySQLQuery(tt.prefix)(tt.chunk); got != tt.want {
				t.Errorf("MySQLQuery(%q)(%q) = %v, want %v", tt.prefix, tt.chunk, got, tt.want)
			}
		})
	}
}

// resp encodes a command as clients send it: a RESP array of bulk strings.
func resp(args ...string) []byte {
	b := fmt.Appendf(nil, "*%d\r\n", len(args))
	for _, a := range args {
		b = fmt.Appendf(b, "$%d\r\n%s\r\n", len(a), a)
	}
	return b
}

func TestRedisCommand(t *testing.T) {
	pipeline := slices.Concat(resp("SET", "a", "1"), resp("INCR", "k"), resp("GET", "a"))
	tests := []struct {
		name  string
		cmd   []string // name, then args
		chunk []byte
		want  bool
	}{
		{"the command", []string{"INCR", "k"}, resp("INCR", "k"), true},
		{"name in any case", []string{"incr", "k"}, resp("INCR", "k"), true},
		{"name only", []string{"INCR"}, resp("INCR", "k"), true},
		{"inside a pipeline", []string{"INCR", "k"}, pipeline, true},
		{"binary-safe argument", []string{"SET", "a\r\nb"}, resp("SET", "a\r\nb", "1"), true},
		{"other key", []string{"INCR", "k"}, resp("INCR", "K"), false},
		{"missing argument", []string{"INCR", "k"}, resp("INCR"), false},
		{"other command", []string{"INCR", "k"}, resp("DECR", "k"), false},
		{"command cut by the chunk's end", []string{"INCR", "k"}, pipeline[:len(resp("SET", "a", "1"))+10], false},
		{"inline command", []string{"PING"}, []byte("PING\r\n"), false},
		{"empty chunk", []string{"PING"}, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := faultproxy.RedisCommand(tt.cmd[0], tt.cmd[1:]...)(tt.chunk); got != tt.want {
				t.Errorf("RedisCommand(%q)(%q) = %v, want %v", tt.cmd, tt.chunk, got, tt.want)
			}
		})
	}
}

func TestRedisScript(t *testing.T) {
	const src = "return redis.call('INCR', KEYS[1])"
	sum := sha1.Sum([]byte(src))
	sha := hex.EncodeToString(sum[:])
	tests := []struct {
		name  string
		chunk []byte
		want  bool
	}{
		{"EVALSHA", resp("EVALSHA", sha, "1", "k"), true},
		{"EVAL", resp("EVAL", src, "1", "k"), true},
		{"in a pipeline", slices.Concat(resp("GET", "k"), resp("evalsha", sha, "1", "k")), true},
		{"other script", resp("EVALSHA", "0123456789012345678901234567890123456789", "1", "k"), false},
		{"not a script", resp("INCR", "k"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := faultproxy.RedisScript(src)(tt.chunk); got != tt.want {
				t.Errorf("RedisScript(...)(%q) = %v, want %v", tt.chunk, got, tt.want)
			}
		})
	}
}
