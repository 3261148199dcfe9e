package main

import (
	"bufio"
	"errors"
	"io"
	"strings"
	"testing"
)

// after is a second response behind each case's, on the same connection:
// a case that may keep its connection must leave the reader just before
// it.
const after = "HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok"

func TestReadResponse(t *testing.T) {
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
		{name: "cut short", in: "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", err: io.EOF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := tc.in
			if tc.err == nil {
				in += after
			}
			r := bufio.NewReader(strings.NewReader(in))
			status, keep, err := readResponse(r, tc.head)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("err %v, want %v", err, tc.err)
				}
				return
			}
			if err != nil || status != tc.status || keep != tc.keep {
				t.Fatalf("status %d keep %v err %v, want %d %v", status, keep, err, tc.status, tc.keep)
			}
			if keep {
				if status, _, err := readResponse(r, false); err != nil || status != 201 {
					t.Errorf("the next response: %d %v, want 201: this one was not read to its end", status, err)
				}
			}
		})
	}
}

// Without a length the body runs to the end of the connection.
func TestReadResponseToClose(t *testing.T) {
	r := bufio.NewReader(strings.NewReader("HTTP/1.1 200 OK\r\n\r\nall of it"))
	status, keep, err := readResponse(r, false)
	if err != nil || status != 200 || keep {
		t.Fatalf("status %d keep %v err %v, want 200, not kept", status, keep, err)
	}
	if n, _ := r.Read(make([]byte, 1)); n != 0 {
		t.Error("the body was not read to the end")
	}
}

// BenchmarkReadResponse: reading an answer allocates nothing.
func BenchmarkReadResponse(b *testing.B) {
	resp := "HTTP/1.1 409 Conflict\r\nContent-Type: application/json; charset=utf-8\r\nDate: Sat, 28 Nov 2026 13:00:00 GMT\r\nContent-Length: 46\r\n\r\n" +
		`{"error":{"code":"sold_out","message":"gone"}}`
	src := strings.NewReader(resp)
	r := bufio.NewReader(src)
	b.ReportAllocs()
	for b.Loop() {
		src.Reset(resp)
		r.Reset(src)
		if _, _, err := readResponse(r, false); err != nil {
			b.Fatal(err)
		}
	}
}
