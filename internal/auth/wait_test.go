package auth

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/testenv"
)

// The wait after wrong guesses is written once, in wait.lua, and the
// three scripts that count or gate on wrong guesses begin with it. These
// pin its values on the real Redis, as the scripts compute them: none for
// the free guesses, then firstDelay doubling up to the longest; during an
// attack no guess is free, so the first wrong one already waits
// firstDelay.
func TestWaitFormula(t *testing.T) {
	rdb := testenv.Redis(t, 0)
	ctx := context.Background()
	after := redis.NewScript(waitSrc + `
local free = free_guesses(tonumber(ARGV[2]), ARGV[3] == '1')
return wait_after(tonumber(ARGV[1]), free, tonumber(ARGV[4]), tonumber(ARGV[5]))`)
	first, hour := firstDelay.Milliseconds(), time.Hour.Milliseconds()
	for _, c := range []struct {
		n, free int
		attack  bool
		longest int64
		want    int64
	}{
		{n: 1, free: 3, longest: hour, want: 0},
		{n: 3, free: 3, longest: hour, want: 0},
		{n: 4, free: 3, longest: hour, want: 1000},
		{n: 5, free: 3, longest: hour, want: 2000},
		{n: 6, free: 3, longest: hour, want: 4000},
		{n: 15, free: 3, longest: hour, want: 2_048_000},
		{n: 16, free: 3, longest: hour, want: 3_600_000}, // 4,096 s: past the hour
		{n: 1_000_000, free: 3, longest: hour, want: 3_600_000},
		{n: 2, free: 0, longest: hour, want: 2000},
		{n: 1, free: 3, attack: true, longest: hour, want: 1000},
		{n: 3, free: 3, attack: true, longest: hour, want: 4000},
		{n: 7, free: 3, longest: 5000, want: 5000},
		{n: 9, free: 3, longest: 0, want: 0},
	} {
		got, err := after.Run(ctx, rdb, nil, c.n, c.free, b2i(c.attack), first, c.longest).Int64()
		if err != nil || got != c.want {
			t.Errorf("wrong guess %d of %d free (attack %v, longest %d ms): %d ms, %v; want %d ms", c.n, c.free, c.attack, c.longest, got, err, c.want)
		}
	}

	// And as the scripts keep it: a count's until is now + its wait.
	t.Run("the counts' until", func(t *testing.T) {
		key := testenv.Name("login:test:{wait}:")
		keys := []string{key + "failed", key + "inflight"}
		t.Cleanup(func() { rdb.Del(context.Background(), keys...) })
		const free = 2
		for n := 1; n <= 6; n++ {
			if err := settleGuessScript.Run(ctx, rdb, keys, "a", 1, free, 0, first, 5000, time.Hour.Milliseconds()).Err(); err != nil {
				t.Fatal(err)
			}
			want := map[int]int64{1: 0, 2: 0, 3: 1000, 4: 2000, 5: 4000, 6: 5000}[n]
			if left := waitLeft(t, rdb, keys[0]); left > want || left < want-500 || (want == 0 && left != 0) {
				t.Errorf("settled wrong guess %d of %d free: waits %d ms, want %d", n, free, left, want)
			}
			res, err := admitGuessScript.Run(ctx, rdb, keys, free, 0, fmt.Sprint("b", n), attemptFor.Milliseconds()).Int64Slice()
			if err != nil {
				t.Fatal(err)
			}
			if gated := len(res) == 2 && res[0] == admitWait; gated != (want > 0) {
				t.Errorf("after wrong guess %d of %d free: admit answered %v, want a wait: %v", n, free, res, want > 0)
			}
			rdb.ZRem(ctx, keys[1], fmt.Sprint("b", n))
		}
	})
}

// waitLeft is the ms until the count in the hash at key ends its wait,
// on Redis' clock; 0 if it has ended.
func waitLeft(t *testing.T, rdb *redis.Client, key string) int64 {
	t.Helper()
	until, err := rdb.HGet(context.Background(), key, "until").Int64()
	if err != nil {
		t.Fatal(err)
	}
	now, err := rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return max(until-now.UnixMilli(), 0)
}

// The formula lives in wait.lua alone: none of the scripts that begin
// with it writes it again.
func TestWaitFormulaWrittenOnce(t *testing.T) {
	for name, src := range map[string]string{"admit_guess.lua": admitGuessSrc, "check_code.lua": checkCodeSrc, "settle_guess.lua": settleGuessSrc} {
		for _, again := range []string{"2 ^", "redis.call('TIME')", "n > free"} {
			if strings.Contains(src, again) {
				t.Errorf("%s writes %q itself: it belongs in wait.lua", name, again)
			}
		}
	}
}
