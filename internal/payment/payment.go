// Package payment is the service's side of a payment provider: the events
// the provider sends to the webhook (POST /payments/webhook), their
// signature, and the small interface through which the service asks the
// provider to charge a buyer or give money back.
//
// A provider confirms a payment later, by calling the webhook, and it may
// call late, twice, or out of order: the receiving side (package order)
// applies each event at most once, keyed by its event_id. What this
// package guarantees is that an event is the provider's: the header
// Seckill-Signature carries t=<unix seconds>,v1=<hex HMAC-SHA256 of
// "<t>.<body>">, keyed with a secret only the two share, and an event
// more than Tolerance away from the server's clock is refused, so that a
// recorded event cannot be replayed days later.
//
// No real provider ships with the project. Fake (fake.go) plays one for
// the embedded demo and the tests: it calls the webhook as a provider
// would, signed, after a moment, and on request twice.
package payment

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Header is the signature's header.
const Header = "Seckill-Signature"

// Tolerance is how far an event's time may be from the server's clock.
const Tolerance = 300 * time.Second

// MinSecret is the shortest webhook secret accepted outside the demo: an
// HMAC-SHA256 key as long as its hash.
const MinSecret = 32

// Event is the provider's word that a payment for an order succeeded.
type Event struct {
	ID      string // the provider's event_id: the same for every retry of one event
	OrderID int64
	Amount  int64 // cents
}

var eventIDPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// ErrMalformed is a body that is not an event.
var ErrMalformed = errors.New("payment: malformed event")

// ParseEvent reads an event from a webhook's body: one JSON object
// {"event_id": "<1 to 64 of [A-Za-z0-9_-]>", "order_id": "<decimal>",
// "amount": <cents>}.
//
// The body is read as strictly as it is signed: a key given twice, or
// spelt in another case ("Amount"), makes it malformed. Go's decoder
// would take the last of two keys and match names in any case, so a
// body read one way here could be read another way by the provider's own
// records, or by any other reader of the same signed bytes.
func ParseEvent(body []byte) (Event, error) {
	if err := onceEach(body, "event_id", "order_id", "amount"); err != nil {
		return Event{}, err
	}
	var in struct {
		EventID *string `json:"event_id"`
		OrderID *string `json:"order_id"`
		Amount  *int64  `json:"amount"`
	}
	if err := json.Unmarshal(body, &in); err != nil || in.EventID == nil || in.OrderID == nil || in.Amount == nil {
		return Event{}, fmt.Errorf("%w: want one JSON object with event_id, order_id and amount", ErrMalformed)
	}
	if !eventIDPattern.MatchString(*in.EventID) {
		return Event{}, fmt.Errorf("%w: event_id must be 1 to 64 of A-Z, a-z, 0-9, _ and -", ErrMalformed)
	}
	id, err := strconv.ParseInt(*in.OrderID, 10, 64)
	if err != nil || id <= 0 || (*in.OrderID)[0] < '0' || (*in.OrderID)[0] > '9' {
		return Event{}, fmt.Errorf("%w: order_id must be a positive decimal integer in a string", ErrMalformed)
	}
	if *in.Amount < 0 {
		return Event{}, fmt.Errorf("%w: amount must not be negative", ErrMalformed)
	}
	return Event{ID: *in.EventID, OrderID: id, Amount: *in.Amount}, nil
}

// onceEach checks that body is a JSON object whose keys are each given
// once, and that a key naming one of fields is spelt exactly as it.
// Other keys are allowed: a provider adds fields over time.
func onceEach(body []byte, fields ...string) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return fmt.Errorf("%w: want one JSON object", ErrMalformed)
	}
	seen := map[string]bool{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return fmt.Errorf("%w: want one JSON object", ErrMalformed)
		}
		key := t.(string) // an object's keys are strings, or Token fails
		folded := strings.ToLower(key)
		if seen[folded] {
			return fmt.Errorf("%w: the key %q is given twice", ErrMalformed, key)
		}
		seen[folded] = true
		for _, f := range fields {
			if folded == f && key != f {
				return fmt.Errorf("%w: the key %q must be spelt %q", ErrMalformed, key, f)
			}
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return fmt.Errorf("%w: want one JSON object", ErrMalformed)
		}
	}
	return nil // the closing brace and what follows: json.Unmarshal checks
}

// Body is the webhook's body for e, as a provider sends it.
func (e Event) Body() []byte {
	b, _ := json.Marshal(struct {
		EventID string `json:"event_id"`
		OrderID string `json:"order_id"`
		Amount  int64  `json:"amount"`
	}{e.ID, strconv.FormatInt(e.OrderID, 10), e.Amount})
	return b
}

// Sign is the signature header's value for body, sent at t.
func Sign(secret, body []byte, t time.Time) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + mac(secret, ts, body)
}

func mac(secret []byte, ts string, body []byte) string {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(ts))
	h.Write([]byte("."))
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

// ErrBadSignature is a webhook call whose signature is missing, wrong, or
// too far from now.
var ErrBadSignature = errors.New("payment: bad signature")

// Verify checks header, a Seckill-Signature, against body and now. The
// comparison takes the same time whatever the signature: a byte-by-byte
// comparison that stopped at the first difference would tell an attacker
// how many bytes they got right.
func Verify(secret, body []byte, header string, now time.Time) error {
	var ts, sig string
	var seenT, seenV1 bool
	for part := range strings.SplitSeq(header, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "t":
			if seenT {
				return fmt.Errorf("%w: %s names t twice", ErrBadSignature, Header)
			}
			ts, seenT = v, true
		case "v1":
			// One key, one signature: a header with two would be read
			// by whichever one a parser keeps (the first, the last),
			// and two parsers of one header must not disagree.
			if seenV1 {
				return fmt.Errorf("%w: %s names v1 twice", ErrBadSignature, Header)
			}
			sig, seenV1 = v, true
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || sig == "" {
		return fmt.Errorf("%w: %s must be t=<unix seconds>,v1=<hex>", ErrBadSignature, Header)
	}
	if d := now.Sub(time.Unix(sec, 0)); d > Tolerance || d < -Tolerance {
		return fmt.Errorf("%w: signed %s from the server's clock, more than %s", ErrBadSignature, d.Round(time.Second), Tolerance)
	}
	if !hmac.Equal([]byte(sig), []byte(mac(secret, ts, body))) {
		return fmt.Errorf("%w: it does not match the body", ErrBadSignature)
	}
	return nil
}

// Provider is the payment provider, as the service talks to it. A real
// one's client plugs in here; package order never knows which.
//
// Money moves once per order, and the order's ID is the key that makes
// it so: a real provider's client sends it as the idempotency key of each
// request (Stripe's Idempotency-Key, Alipay's out_trade_no, WeChat Pay's
// out_trade_no and out_refund_no). The service asks once per order
// (package order claims each ask in the order's row), but an ask whose
// answer was lost, or whose asker died, is asked again, and only the key
// keeps that from moving the money twice.
type Provider interface {
	// Charge asks the provider to take amount cents from the buyer for an
	// order. The provider confirms later, through the webhook: the order
	// is paid when that event is applied, not when Charge returns. Asked
	// again for an order whose charge is under way or done, it charges no
	// more: it answers as for the first ask, and at most confirms the one
	// payment again (the same event_id). A charge that ended unpaid (the
	// card declined, the cashier closed or abandoned) is over: the next
	// ask for the order starts a new one (a client keys its requests by
	// the order and that attempt, say "<order>-<n>", and moves to the next
	// attempt only once the provider says the last one ended).
	Charge(ctx context.Context, orderID, amount int64) error
	// Refund asks the provider to give amount cents back for an order.
	// Asked twice for one order, it gives back once, so that a refund
	// whose answer was lost can be asked again.
	Refund(ctx context.Context, orderID, amount int64) error
}
