package main

import (
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"seckill/internal/admission"
	"seckill/internal/apperr"
	"seckill/internal/testenv"
)

// answer is one raw seckill answer, with what the ledger leaves out.
type answer struct {
	Status     int
	RetryAfter string
	Message    string // the error envelope's message, if any
	Took       time.Duration
	Err        error
}

func rawBuy(base, token, vid string) answer {
	req, _ := http.NewRequest("POST", base+"/seckill/"+vid, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	start := time.Now()
	resp, err := client.Do(req)
	a := answer{Took: time.Since(start), Err: err}
	if err == nil {
		var env struct {
			Error struct{ Message string } `json:"error"`
		}
		json.NewDecoder(resp.Body).Decode(&env)
		resp.Body.Close()
		a.Status, a.RetryAfter, a.Message = resp.StatusCode, resp.Header.Get("Retry-After"), env.Error.Message
	}
	return a
}

// burst sends n requests of one user at once.
func burst(base, token, vid string, n int) []answer {
	out := make([]answer, n)
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i := range out {
		wg.Go(func() { <-gate; out[i] = rawBuy(base, token, vid) })
	}
	close(gate)
	wg.Wait()
	return out
}

// One user floods the buy button: past their burst, 429 busy with
// Retry-After, answered by the instance's token bucket before any work;
// another user buying meanwhile is not slowed or refused.
func TestBuyButtonThrottledPerUser(t *testing.T) {
	st := newStack(t, 0)
	// A rate that never refills within the test: a slow burst (a loaded
	// machine) still meets only its 5 tokens.
	inst := start(t, st.env(freeAddr(t), "SECKILL_RATE", "0.001", "SECKILL_BURST", "5"))
	admin, _ := mustLogin(t, inst.Base, adminPhone)
	vid := openVoucher(t, inst.Base, admin, 100)
	users := loginMany(t, inst.Base, 2)

	var flood []answer
	var other answer
	var wg sync.WaitGroup
	wg.Go(func() { flood = burst(inst.Base, users[0].Token, vid, 30) })
	wg.Go(func() { time.Sleep(5 * time.Millisecond); other = rawBuy(inst.Base, users[1].Token, vid) })
	wg.Wait()

	throttled := 0
	for _, a := range flood {
		if a.Err != nil {
			t.Fatal(a.Err)
		}
		// The bucket's refusal, told apart by its message from the busy of
		// the user's own request in flight (which has a Retry-After too).
		if a.Status == http.StatusTooManyRequests && a.RetryAfter != "" && a.Message == apperr.As(admission.ErrTooFast).Message {
			throttled++
		}
	}
	// 5 pass the bucket (one buys; the rest meet the user's lock or order).
	if throttled != 25 {
		t.Errorf("%d of 30 flooding requests throttled, want 25 (burst 5)", throttled)
	}
	if other.Status != http.StatusOK {
		t.Errorf("another user, during the flood: %d, want 200", other.Status)
	}
}

// Far more requests at once than the instance's cap: those beyond it get
// 429 busy with Retry-After at once instead of queueing; none waits
// longer than the write deadline; and the sale's invariants hold.
func TestOverloadAnsweredAtOnce(t *testing.T) {
	st := newStack(t, 0)
	inst := start(t, st.env(freeAddr(t), "MAX_IN_FLIGHT", "4", "STOCK_HOLD", "3s"))
	// Users log in through another instance, without the cap: tokens are
	// good on every instance.
	door := start(t, st.env(freeAddr(t)))
	admin, _ := mustLogin(t, door.Base, adminPhone)
	const initial = 100
	vid := openVoucher(t, door.Base, admin, initial)
	users := loginMany(t, door.Base, 80)
	db, rdb := testenv.Open(t, st.DSN), testenv.Redis(t, st.RedisDB)

	// Writes wait on the voucher's row: the requests let in stay in
	// flight until their write deadline (STOCK_HOLD/3 = 1s).
	release := holdVoucherRow(t, st.DSN, vid)
	answers := make([]answer, len(users))
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i, u := range users {
		wg.Go(func() { <-gate; answers[i] = rawBuy(inst.Base, u.Token, vid) })
	}
	close(gate)
	wg.Wait()
	release()

	refused, slowest := 0, time.Duration(0)
	for _, a := range answers {
		if a.Err != nil {
			t.Fatal(a.Err)
		}
		slowest = max(slowest, a.Took)
		switch {
		case a.Status == http.StatusTooManyRequests && a.RetryAfter != "":
			refused++
		case a.Status == http.StatusServiceUnavailable, a.Status == http.StatusOK:
		default:
			t.Errorf("answer %d: the contract allows 200, 429 or 503 here", a.Status)
		}
	}
	if refused < len(users)-10 {
		t.Errorf("%d of %d refused at the cap of 4, want nearly all", refused, len(users))
	}
	if slowest > 3*time.Second {
		t.Errorf("the slowest answer took %s, past the write deadline (1s) and then some", slowest)
	}
	s := waitRest(t, db, rdb, vid, 10*time.Second)
	checkInvariants(t, s, initial, nil)
}
