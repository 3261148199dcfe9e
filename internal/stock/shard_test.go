package stock_test

import (
	"context"
	"strings"
	"testing"

	"seckill/internal/stock"
	"seckill/internal/testenv"
)

// Slot agrees with Redis' CLUSTER KEYSLOT, and each shard's keys land in
// its own sixteenth of the slots, all keys of one shard in one slot.
func TestShardSlots(t *testing.T) {
	rdb := testenv.StartCluster(t).Client(t)
	ctx := context.Background()
	for _, key := range []string{"a", "seckill:vouchers", "icr:order:2026:11:24", "123456789"} {
		want, err := rdb.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := stock.Slot(key); int64(got) != want {
			t.Errorf("Slot(%q) = %d, Redis says %d", key, got, want)
		}
	}
	tag := func(key string) string { return key[strings.Index(key, "{")+1 : strings.Index(key, "}")] }
	for k := range stock.Shards {
		slot := stock.Slot(tag(stock.ShardKey(k, "orders")))
		if slot/(16384/stock.Shards) != k {
			t.Errorf("shard %d's key %s is in slot %d, outside its sixteenth", k, stock.ShardKey(k, "orders"), slot)
		}
	}
	for _, id := range []int64{1, 16, 17, 1 << 40} {
		k := stock.ShardOf(id)
		if a, b := tag(stock.KeysOf(id).Stock), tag(stock.ShardKey(k, "orders")); a != b {
			t.Errorf("voucher %d's stock tag %q, its shard's %q", id, a, b)
		}
	}
}
