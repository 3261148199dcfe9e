package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

// TestConfigurationDocumented holds docs/configuration.md to loadConfig:
// every variable the server reads has a row there, and every row names a
// variable it reads. The variables are the ones loadConfig asks getenv
// for, in the demo and on the real stack with every branch that reads
// more (LOCK_BACKEND=redlock reads REDLOCK_ADDRS), so a new setting
// cannot be added without its row, nor a row outlive its setting. The
// retired settings, which the server asks for only to refuse them, belong
// in docs/upgrading.md instead. It needs no MySQL or Redis: loadConfig
// only reads.
func TestConfigurationDocumented(t *testing.T) {
	asked := map[string]bool{}
	for _, env := range []map[string]string{
		{}, // the embedded demo
		{"MYSQL_DSN": "u:p@tcp(127.0.0.1:3306)/seckill", "REDIS_ADDR": "127.0.0.1:6379", "LOCK_BACKEND": "redlock"},
		{"MYSQL_DSN": "u:p@tcp(127.0.0.1:3306)/seckill", "REDIS_ADDRS": "127.0.0.1:26379", "REDIS_MASTER_NAME": "m", "SECKILL_MODE": "async"},
	} {
		// The errors do not matter here, only the names asked for.
		_, _ = loadConfig(func(k string) string {
			asked[k] = true
			return env[k]
		})
	}
	var read []string
	for k := range asked {
		if !slices.Contains(retiredVars, k) {
			read = append(read, k)
		}
	}
	sort.Strings(read)

	doc, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := documentedVars(string(doc))
	for _, k := range read {
		if !rows[k] {
			t.Errorf("the server reads %s, which has no row in docs/configuration.md", k)
		}
	}
	for k := range rows {
		if !asked[k] {
			t.Errorf("docs/configuration.md has a row for %s, which the server does not read", k)
		}
		if slices.Contains(retiredVars, k) {
			t.Errorf("docs/configuration.md has a row for %s, which the server refuses at start (it belongs in docs/upgrading.md)", k)
		}
	}
	up, err := os.ReadFile("../../docs/upgrading.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range retiredVars {
		if !strings.Contains(string(up), "`"+k+"`") {
			t.Errorf("docs/upgrading.md does not name the retired %s, which the server refuses at start", k)
		}
	}
	// And every name the configuration's source writes as a string, so
	// that a variable read only in a branch the three settings above do
	// not take (a cluster's, TLS's) is held to its row too.
	files, err := filepath.Glob("config*.go")
	if err != nil {
		t.Fatal(err)
	}
	literal := regexp.MustCompile(`"([A-Z][A-Z0-9_]{2,})"`)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range literal.FindAllStringSubmatch(string(src), -1) {
			if k := m[1]; !rows[k] && !slices.Contains(retiredVars, k) {
				t.Errorf("%s names %s, which has no row in docs/configuration.md", f, k)
			}
		}
	}
	if len(read) < 50 {
		t.Errorf("only %d variables asked for: %v; has loadConfig stopped reading through getenv?", len(read), read)
	}
}

// documentedVars returns the variables that the rows of the tables in a
// configuration page name in their first cell: each `NAME` in capitals
// there (a row may name two, such as REDIS_USERNAME and REDIS_PASSWORD).
func documentedVars(doc string) map[string]bool {
	name := regexp.MustCompile("`([A-Z][A-Z0-9_]+)`")
	out := map[string]bool{}
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		first := strings.SplitN(strings.TrimPrefix(line, "|"), "|", 2)[0]
		for _, m := range name.FindAllStringSubmatch(first, -1) {
			out[m[1]] = true
		}
	}
	return out
}
