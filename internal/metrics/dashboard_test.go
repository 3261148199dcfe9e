package metrics

import (
	"context"
	"database/sql"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"testing"

	_ "github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"

	"seckill/internal/order/queue"
)

// The Grafana dashboard of docker-compose.yml asks Prometheus only for
// series this package exports: a renamed metric would leave a panel empty
// without a word. Every name its queries use (seckill_*, go_sql_*, with a
// histogram's _bucket, _sum or _count) must be one the registry gathers.
func TestDashboardAsksForExportedSeries(t *testing.T) {
	raw, err := os.ReadFile("../../deploy/grafana/dashboards/seckill.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}

	m := New(slog.New(slog.NewTextHandler(io.Discard, nil)))
	db, err := sql.Open("mysql", "u:p@tcp(127.0.0.1:1)/x") // never dialled: only its pool's stats are read
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	m.WatchDB(db)
	m.WatchRedis(rdb)
	m.WatchQueue(func(context.Context) (queue.Stats, error) { return queue.Stats{}, nil })
	families, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, f := range families {
		exported[f.GetName()] = true
	}

	name := regexp.MustCompile(`\b(seckill|go_sql)_[a-z_]+\b`)
	asked := 0
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			for _, n := range name.FindAllString(q.Expr, -1) {
				asked++
				base := n
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if trimmed, ok := strings.CutSuffix(n, suffix); ok && exported[trimmed] {
						base = trimmed
					}
				}
				if !exported[base] {
					t.Errorf("panel %q asks for %s, which is not exported", p.Title, n)
				}
			}
		}
	}
	if asked == 0 {
		t.Fatal("no series found in the dashboard's queries")
	}
}
