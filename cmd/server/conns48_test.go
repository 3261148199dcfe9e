package main

import (
	"strings"
	"testing"
)

// MAX_CONNS_PER_IPV6_48 caps the connections of one IPv6 /48: 4096 by
// default, 0 off, and a value out of range refused at start.
func TestConnsPer48Config(t *testing.T) {
	for _, tt := range []struct {
		value   string
		want    int
		wantErr bool
	}{
		{"", 4096, false},
		{"0", 0, false},
		{"100", 100, false},
		{"-1", 0, true},
		{"many", 0, true},
	} {
		env := withEnv(realEnv, "MAX_CONNS_PER_IPV6_48", tt.value)
		cfg, err := loadConfig(func(k string) string { return env[k] })
		switch {
		case tt.wantErr && (err == nil || !strings.Contains(err.Error(), "MAX_CONNS_PER_IPV6_48")):
			t.Errorf("MAX_CONNS_PER_IPV6_48=%q: %v, want it refused", tt.value, err)
		case !tt.wantErr && err != nil:
			t.Errorf("MAX_CONNS_PER_IPV6_48=%q: %v", tt.value, err)
		case !tt.wantErr && cfg.MaxConnsPer48 != tt.want:
			t.Errorf("MAX_CONNS_PER_IPV6_48=%q: %d, want %d", tt.value, cfg.MaxConnsPer48, tt.want)
		}
	}
}
