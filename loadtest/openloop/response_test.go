//go:build linux

package main

import (
	"errors"
	"testing"
)

// after is a second response behind each case's on the same connection:
// where a case's response ends, this one must start.
const after = "HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok"

func TestParseResponse(t *testing.T) {
	for _, tc := range []struct {
		name   string
		head   bool
		in     string
		status int
		keep   bool
		err    error
	}{
		{name: "content-length", in: "HTTP/1.1 409 Conflict\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"a\":\"b\"}\n\n", status: 409, keep: true},
		{name: "header case", in: "HTTP/1.1 200 OK\r\ncontent-LENGTH:3\r\n\r\nabc", status: 200, keep: true},
		{name: "chunked", in: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n1A\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nTrailer: x\r\n\r\n", status: 200, keep: true},
		{name: "connection close", in: "HTTP/1.1 503 Service Unavailable\r\nConnection: keep-alive, Close\r\nContent-Length: 0\r\n\r\n", status: 503},
		{name: "HTTP/1.0", in: "HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx", status: 200},
		{name: "204 without length", in: "HTTP/1.1 204 No Content\r\n\r\n", status: 204, keep: true},
		{name: "100 continue first", in: "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 429 Too Many Requests\r\nContent-Length: 2\r\n\r\n{}", status: 429, keep: true},
		{name: "HEAD has no body", head: true, in: "HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n", status: 200, keep: true},
		{name: "malformed status", in: "HTTP/2 200\r\n\r\n", err: errMalformed},
		{name: "malformed length", in: "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", err: errMalformed},
		{name: "malformed chunk", in: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", err: errMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			buf := []byte(tc.in + after)
			r, err := parseResponse(buf, tc.head)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("err %v, want %v", err, tc.err)
				}
				return
			}
			if err != nil || r.size != len(tc.in) || r.status != tc.status || r.keep != tc.keep || r.toClose {
				t.Fatalf("%+v, %v; want size %d status %d keep %v", r, err, len(tc.in), tc.status, tc.keep)
			}
			// Every shorter prefix is not whole yet.
			for n := range len(tc.in) {
				if r, err := parseResponse(buf[:n], tc.head); err != nil || r.size != 0 {
					t.Fatalf("the first %d bytes: %+v, %v; want not whole", n, r, err)
				}
			}
			if r, err := parseResponse(buf[r.size:], false); err != nil || r.status != 201 {
				t.Errorf("the next response: %+v %v, want 201", r, err)
			}
		})
	}
}

// Without a length the body runs to the end of the connection.
func TestParseResponseToClose(t *testing.T) {
	head := "HTTP/1.1 200 OK\r\n\r\n"
	r, err := parseResponse([]byte(head+"all of it"), false)
	if err != nil || r.status != 200 || r.keep || !r.toClose || r.size != len(head) {
		t.Fatalf("%+v, %v; want 200 to the close, not kept", r, err)
	}
}

// BenchmarkParseResponse: parsing an answer allocates nothing.
func BenchmarkParseResponse(b *testing.B) {
	resp := []byte("HTTP/1.1 409 Conflict\r\nContent-Type: application/json; charset=utf-8\r\nDate: Sat, 28 Nov 2026 13:00:00 GMT\r\nContent-Length: 46\r\n\r\n" +
		`{"error":{"code":"sold_out","message":"gone"}}`)
	b.ReportAllocs()
	for b.Loop() {
		if r, err := parseResponse(resp, false); err != nil || r.size != len(resp) {
			b.Fatal(r, err)
		}
	}
}
