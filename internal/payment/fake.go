package payment

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"time"

	"seckill/internal/web"
)

// Fake is a payment provider for the embedded demo and the tests. Charge
// takes the buyer's word for it and confirms the payment the way a real
// provider does: it calls the webhook, signed with the shared secret,
// after Delay, in the background, and again as long as the answer is a
// 5xx, a 429 or nothing (a real provider retries until it gets an answer
// it trusts). With Twice it sends every event twice, the second a moment
// after the first: the duplicate delivery every real provider makes
// sooner or later.
//
// It must never run in production: it lets anyone pay without paying. The
// server uses it only in the demo, or with PAYMENT_FAKE=true.
type Fake struct {
	*web.Loopback // the server's router, where the webhook is; and the calls' lifetime
	secret        []byte
	log           *slog.Logger
	now           func() time.Time

	Delay time.Duration // before the first call of the webhook
	Twice bool          // every event sent twice

	mu      sync.Mutex
	charges map[int64]*asks // by order
	refunds map[int64]*asks // by order; amount: the cents given back
}

// asks is what a Fake was asked for one order, and did.
type asks struct {
	asked  int   // times asked
	amount int64 // cents taken (Charge) or given back (Refund), once
}

// NewFake returns a Fake that signs its events with secret.
// SetTarget names the router the webhook calls go to, and Close stops the
// calls still waiting and waits for those under way (web.Loopback).
func NewFake(secret []byte, log *slog.Logger) *Fake {
	return &Fake{Loopback: web.NewLoopback(), secret: secret, log: log, now: time.Now, Delay: 200 * time.Millisecond,
		charges: map[int64]*asks{}, refunds: map[int64]*asks{}}
}

// Charge confirms the payment through the webhook, in the background,
// once per order, as Provider asks of a real provider: asked again for the
// same order, it charges nothing more and sends no new event (and counts
// the ask, which Asked reports, so that a test sees how often the service
// asked).
func (f *Fake) Charge(_ context.Context, orderID, amount int64) error {
	f.mu.Lock()
	c := f.ask(f.charges, orderID)
	first := c.asked == 1
	if first {
		c.amount = amount
	}
	f.mu.Unlock()
	if !first {
		f.log.Info("fake payment provider: asked again to charge an order; its key says it is charged already", "order", orderID)
		return nil
	}
	id := make([]byte, 12)
	rand.Read(id)
	e := Event{ID: "fake_" + hex.EncodeToString(id), OrderID: orderID, Amount: amount}
	sends := 1
	if f.Twice {
		sends = 2
	}
	for i := range sends {
		f.Go(func() { f.deliver(e, f.Delay+time.Duration(i)*50*time.Millisecond) })
	}
	return nil
}

// ask counts an ask for orderID in m, under f.mu.
func (f *Fake) ask(m map[int64]*asks, orderID int64) *asks {
	a := m[orderID]
	if a == nil {
		a = &asks{}
		m[orderID] = a
	}
	a.asked++
	return a
}

// deliver calls the webhook with e after wait, and again, with back-off,
// until it answers something other than a 5xx, or the Fake closes.
func (f *Fake) deliver(e Event, wait time.Duration) {
	for try := 0; ; try++ {
		select {
		case <-f.Context().Done():
			return
		case <-time.After(wait):
		}
		status, answer := f.Send(e)
		if status > 0 && status < 500 && status != http.StatusTooManyRequests {
			return
		}
		f.log.Info("fake payment provider: webhook did not take the event; retrying", "order", e.OrderID, "status", status, "answer", string(answer))
		wait = min(time.Duration(1<<min(try, 5))*100*time.Millisecond, 3*time.Second)
	}
}

// Send calls the webhook once with e, signed now, and returns the status
// and body of the answer (0 if the target is not set).
func (f *Fake) Send(e Event) (int, []byte) {
	body := e.Body()
	req := httptest.NewRequestWithContext(f.Context(), http.MethodPost, "/payments/webhook", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(Header, Sign(f.secret, body, f.now()))
	rec := f.Serve(req)
	if rec == nil {
		return 0, nil
	}
	out, _ := io.ReadAll(rec.Result().Body)
	var a struct {
		Refund bool `json:"refund"`
	}
	if json.Unmarshal(out, &a) == nil && a.Refund {
		f.log.Info("fake payment provider: the payment was refused; giving the money back", "order", e.OrderID, "amount", e.Amount)
	}
	return rec.Code, out
}

// Refund records that amount cents went back for an order: once, however
// often it is asked.
func (f *Fake) Refund(_ context.Context, orderID, amount int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.ask(f.refunds, orderID)
	if r.asked > 1 {
		f.log.Info("fake payment provider: asked again to refund an order; its key says it is refunded already", "order", orderID)
		return nil
	}
	r.amount = amount
	f.log.Info("fake payment provider: refunded", "order", orderID, "amount", strconv.FormatInt(amount, 10))
	return nil
}

// Refunded is what Refund gave back for an order.
func (f *Fake) Refunded(orderID int64) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.refunds[orderID]; r != nil {
		return r.amount
	}
	return 0
}

// Asked is how often the Fake was asked to charge for an order, and to
// refund it.
func (f *Fake) Asked(orderID int64) (charges, refunds int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c := f.charges[orderID]; c != nil {
		charges = c.asked
	}
	if r := f.refunds[orderID]; r != nil {
		refunds = r.asked
	}
	return charges, refunds
}
