package payment

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// A signature verifies only for its own body, key and time, within the
// tolerance either way.
func TestVerify(t *testing.T) {
	secret, body := []byte("0123456789abcdef0123456789abcdef"), []byte(`{"event_id":"e1","order_id":"7","amount":100}`)
	now := time.Unix(1_800_000_000, 0)
	good := Sign(secret, body, now)
	for _, tc := range []struct {
		name, header string
		body         []byte
		at           time.Time
		ok           bool
	}{
		{"signed now", good, body, now, true},
		{"received 300 s later", good, body, now.Add(Tolerance), true},
		{"received 301 s later", good, body, now.Add(Tolerance + time.Second), false},
		{"signed in the future", Sign(secret, body, now.Add(Tolerance+time.Second)), body, now, false},
		{"another body", good, []byte(`{"event_id":"e1","order_id":"7","amount":1}`), now, false},
		{"another key", Sign([]byte("another key, 32 bytes long......"), body, now), body, now, false},
		{"no header", "", body, now, false},
		{"no v1", strings.Split(good, ",")[0], body, now, false},
		{"upper-case hex", strings.ToUpper(good), body, now, false},
		{"spaces around the parts", strings.ReplaceAll(good, ",", " , "), body, now, true},
		{"v1 twice, the good one last", "v1=" + strings.Repeat("0", 64) + "," + good, body, now, false},
		{"v1 twice, the good one first", good + ",v1=" + strings.Repeat("0", 64), body, now, false},
		{"t twice", good + ",t=1", body, now, false},
		{"t twice, the same", good + "," + strings.Split(good, ",")[0], body, now, false},
	} {
		err := Verify(secret, tc.body, tc.header, tc.at)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrBadSignature)) {
			t.Errorf("%s: %v, want ok %t", tc.name, err, tc.ok)
		}
	}
}

// An event is one JSON object of the documented shape, and nothing else.
func TestParseEvent(t *testing.T) {
	for _, tc := range []struct {
		body string
		ok   bool
	}{
		{`{"event_id":"evt_1-A","order_id":"271846193284534273","amount":1990}`, true},
		{`{"event_id":"e","order_id":"1","amount":0}`, true},
		{`{"event_id":"","order_id":"1","amount":0}`, false},
		{`{"event_id":"` + strings.Repeat("a", 65) + `","order_id":"1","amount":0}`, false},
		{`{"event_id":"a b","order_id":"1","amount":0}`, false},
		{`{"event_id":"e","order_id":1,"amount":0}`, false},
		{`{"event_id":"e","order_id":"+1","amount":0}`, false},
		{`{"event_id":"e","order_id":"0","amount":0}`, false},
		{`{"event_id":"e","order_id":"1","amount":-1}`, false},
		{`{"event_id":"e","order_id":"1"}`, false},
		{`{"event_id":"e","order_id":"1","amount":1}{}`, false},
		{`null`, false},
		{`{"event_id":"e","order_id":"1","amount":1,"amount":1990}`, false},
		{`{"event_id":"e","order_id":"1","amount":1990,"amount":1}`, false},
		{`{"event_id":"e","order_id":"1","Amount":1}`, false},
		{`{"event_id":"e","ORDER_ID":"1","amount":1}`, false},
		{`{"event_id":"e","order_id":"1","amount":1,"extra":{"amount":2}}`, true},
		{`{"event_id":"e","order_id":"1","amount":1,"note":"a","Note":"b"}`, false},
		{`["event_id"]`, false},
	} {
		e, err := ParseEvent([]byte(tc.body))
		if (err == nil) != tc.ok {
			t.Errorf("%s: %+v %v, want ok %t", tc.body, e, err, tc.ok)
		}
		if err == nil && string(e.Body()) != tc.body {
			if back, err := ParseEvent(e.Body()); err != nil || back != e {
				t.Errorf("%s: Body() = %s does not parse back", tc.body, e.Body())
			}
		}
	}
}

// Whatever the body, ParseEvent answers without panicking, and an event it
// takes comes back from its own Body.
func FuzzParseEvent(f *testing.F) {
	for _, s := range []string{
		`{"event_id":"evt_1","order_id":"7","amount":100}`,
		`{"event_id":"e","order_id":"1","amount":1,"amount":2}`,
		`{"event_id":"e","order_id":"1","Amount":1}`,
		`{"a":{"b":[1,2,{"c":null}]},"event_id":"e","order_id":"1","amount":0}`,
		`{`, `[]`, `"x"`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		e, err := ParseEvent(body)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("%q: %v, want ErrMalformed", body, err)
			}
			return
		}
		if back, err := ParseEvent(e.Body()); err != nil || back != e {
			t.Fatalf("%q: %+v does not come back from %s: %+v %v", body, e, e.Body(), back, err)
		}
	})
}
