package queue

import (
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"

	"seckill/internal/stock"
)

// An entry is malformed when its voucher belongs to another shard than the
// stream's: settling it would touch two cluster slots in one script.
func TestParseRefusesAnotherShardsVoucher(t *testing.T) {
	p := &Consumer{cfg: Config{Shard: 3}}
	entry := func(voucher int64) redis.XMessage {
		return redis.XMessage{ID: "1-0", Values: map[string]any{
			"id": "42", "user": "7", "voucher": strconv.FormatInt(voucher, 10), "at": "1700000000000",
		}}
	}
	var own, other int64 = 3, 4
	if stock.ShardOf(own) != 3 || stock.ShardOf(other) == 3 {
		t.Fatal("the test's vouchers are not where it thinks")
	}
	if o, err := p.parse(entry(own)); err != nil || o.VoucherID != own {
		t.Errorf("an entry of the stream's own shard: %+v %v", o, err)
	}
	if _, err := p.parse(entry(other)); err == nil {
		t.Error("an entry of another shard's voucher was taken")
	}
}
