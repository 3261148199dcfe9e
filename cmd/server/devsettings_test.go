package main

import (
	"strings"
	"testing"
)

// The development settings stay on loopback: HTTP_ADDR without a host is
// moved there, a host that is not loopback is refused at start, unless
// ALLOW_DEV_SETTINGS_ON_NETWORK says every client is trusted; without
// them nothing moves.
func TestDevSettingsStayOnLoopback(t *testing.T) {
	real, with := realEnv, withEnv
	tests := []struct {
		name     string
		env      map[string]string
		wantAddr string // when no error
		wantErr  string
	}{
		{"demo, default address", map[string]string{}, "127.0.0.1:8080", ""},
		{"demo on a port", map[string]string{"HTTP_ADDR": ":9000"}, "127.0.0.1:9000", ""},
		{"demo on every interface", map[string]string{"HTTP_ADDR": "0.0.0.0:8080"}, "", "AUTH_DEV_CODES, LIVE_CROWD, PAYMENT_FAKE on HTTP_ADDR \"0.0.0.0:8080\", which is not loopback"},
		{"demo on IPv6 wildcard", map[string]string{"HTTP_ADDR": "[::]:8080"}, "", "not loopback"},
		{"demo allowed on the network", map[string]string{"HTTP_ADDR": "0.0.0.0:8080", "ALLOW_DEV_SETTINGS_ON_NETWORK": "true"}, "0.0.0.0:8080", ""},
		{"demo allowed, no host", map[string]string{"ALLOW_DEV_SETTINGS_ON_NETWORK": "true"}, ":8080", ""},
		{"demo on loopback", map[string]string{"HTTP_ADDR": "127.0.0.1:8080"}, "127.0.0.1:8080", ""},
		{"demo on IPv6 loopback", map[string]string{"HTTP_ADDR": "[::1]:8080"}, "[::1]:8080", ""},
		{"demo on localhost", map[string]string{"HTTP_ADDR": "localhost:8080"}, "localhost:8080", ""},
		{"demo, settings off", map[string]string{"HTTP_ADDR": "0.0.0.0:8080", "AUTH_DEV_CODES": "false", "LIVE_CROWD": "false", "PAYMENT_FAKE": "false"}, "0.0.0.0:8080", ""},
		{"real stack", with(real, "HTTP_ADDR", "0.0.0.0:8080"), "0.0.0.0:8080", ""},
		{"real stack, dev codes, no host", with(real, "AUTH_DEV_CODES", "true"), "127.0.0.1:8080", ""},
		{"real stack, dev codes on a network address", with(real, "AUTH_DEV_CODES", "true", "HTTP_ADDR", "10.0.0.5:8080"), "", "AUTH_DEV_CODES on HTTP_ADDR \"10.0.0.5:8080\""},
		{"real stack, crowd on a hostname", with(real, "LIVE_CROWD", "1", "HTTP_ADDR", "app.example:8080"), "", "LIVE_CROWD on HTTP_ADDR"},
		{"real stack, fake payments everywhere", with(real, "PAYMENT_FAKE", "true", "HTTP_ADDR", "0.0.0.0:8080"), "", "PAYMENT_FAKE on HTTP_ADDR"},
		{"real stack, allowed", with(real, "AUTH_DEV_CODES", "true", "HTTP_ADDR", "10.0.0.5:8080", "ALLOW_DEV_SETTINGS_ON_NETWORK", "true"), "10.0.0.5:8080", ""},
		{"body timeout", with(real, "HTTP_BODY_TIMEOUT", "500ms"), ":8080", ""},
		{"body timeout too short", with(real, "HTTP_BODY_TIMEOUT", "10ms"), "", "HTTP_BODY_TIMEOUT must be from 100ms to 10s (it is 10ms)"},
		{"body timeout too long", with(real, "HTTP_BODY_TIMEOUT", "11s"), "", "HTTP_BODY_TIMEOUT must be from 100ms to 10s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := loadConfig(func(k string) string { return tt.env[k] })
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.HTTPAddr != tt.wantAddr {
				t.Errorf("HTTPAddr = %q, want %q", cfg.HTTPAddr, tt.wantAddr)
			}
		})
	}
}
