package api_test

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"

	"seckill/internal/payment"
	"seckill/internal/web"
)

// TestIDPatternIsTheServers checks that the ID schema's pattern admits
// exactly the IDs the server takes: web.ID's path IDs, and the webhook's
// order_id (payment.ParseEvent). Both are strconv.ParseInt's decimal
// int64 from 1 to 2^63-1, digits only, leading zeros allowed; a pattern
// looser than that (such as ^[0-9]+$) documents 0 and values past 2^63-1
// as valid, and clients and validating proxies then send what the server
// answers 400.
func TestIDPatternIsTheServers(t *testing.T) {
	doc := load(t)
	schema := doc.Components.Schemas["ID"].Value
	pattern, err := regexp.Compile(schema.Pattern)
	if err != nil {
		t.Fatal(err)
	}

	gin.SetMode(gin.TestMode)
	pathID := func(s string) bool {
		c, _ := gin.CreateTestContext(httptest.NewRecorder())
		c.Request = httptest.NewRequest(http.MethodGet, "/", nil)
		c.Params = gin.Params{{Key: "id", Value: s}}
		_, ok := web.ID(c, "id")
		return ok
	}
	orderID := func(s string) bool {
		body, _ := json.Marshal(map[string]any{"event_id": "e", "order_id": s, "amount": 0})
		_, err := payment.ParseEvent(body)
		return err == nil
	}

	top := strconv.FormatInt(math.MaxInt64, 10)
	cases := []string{
		"1", "42", "007", "0", "00", "", "01", "10", "100",
		top, "0" + top, "000" + top, "9223372036854775808", "09223372036854775808",
		"9223372036854775799", "9223372036854775800", "9223372036854775806",
		"999999999999999999", "1000000000000000000", "9999999999999999999",
		"10000000000000000000", "18446744073709551615", "99999999999999999999999",
		"-1", "+1", " 1", "1 ", "1\n", "1e3", "0x10", "1_000", "١٢٣", "1/2", "%31", "1.0",
	}
	// Every string of up to three characters over digits and a few others.
	const alphabet = "0129+- a"
	for _, a := range alphabet {
		for _, b := range alphabet {
			for _, c := range alphabet {
				cases = append(cases, string(a), string(a)+string(b), string(a)+string(b)+string(c))
			}
		}
	}
	// Around 2^63-1, each digit of it one lower and one higher, with and
	// without leading zeros; and random digit strings of every length.
	for i := range top {
		for _, d := range []int{-1, 1} {
			b := []byte(top)
			if v := int(b[i]-'0') + d; v >= 0 && v <= 9 {
				b[i] = byte('0' + v)
				cases = append(cases, string(b), "0"+string(b))
			}
		}
	}
	r := rand.New(rand.NewPCG(24, 24))
	for range 20000 {
		var s strings.Builder
		for range r.IntN(3) {
			s.WriteByte('0')
		}
		n := 1 + r.IntN(21)
		for range n {
			s.WriteByte(byte('0' + r.IntN(10)))
		}
		cases = append(cases, s.String())
	}

	for _, s := range cases {
		want := pathID(s)
		if got := pattern.MatchString(s); got != want {
			t.Errorf("ID pattern matches %q: %v; web.ID takes it: %v", s, got, want)
		}
		if got := orderID(s); got != want {
			t.Errorf("webhook order_id %q taken: %v; web.ID takes it: %v", s, got, want)
		}
	}
}
