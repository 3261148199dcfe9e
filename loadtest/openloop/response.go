//go:build linux

package main

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
)

// errMalformed is a response this parser cannot make sense of; the
// connection it came on is closed, since where the next response starts is
// unknown.
var errMalformed = errors.New("openloop: malformed response")

var (
	headerContentLength    = []byte("content-length")
	headerTransferEncoding = []byte("transfer-encoding")
	headerConnection       = []byte("connection")
	tokenChunked           = []byte("chunked")
	tokenClose             = []byte("close")
	crlf                   = []byte("\r\n")
)

// A response is what parseResponse found at the start of a buffer.
type response struct {
	size   int  // bytes it takes, 1xx answers before it included; 0: not whole yet
	status int  // its status
	keep   bool // the connection may carry another request
	// toClose: its body has no length and ends when the server closes;
	// size is then the head's alone, and the rest of the connection is the
	// body.
	toClose bool
}

// parseResponse parses the HTTP/1.x response at the start of buf, as far
// as buf holds it (size 0: read more and call again). A response to HEAD
// (head) has no body whatever its headers say. It allocates nothing: at
// 40,000 requests a second the generator shares two cores with the server
// it measures.
func parseResponse(buf []byte, head bool) (response, error) {
	off := 0
	for {
		r, err := parseOne(buf[off:], head)
		if err != nil || r.size == 0 {
			return response{}, err
		}
		off += r.size
		// 1xx answers (100 Continue, 103 Early Hints) come before the
		// real one; 101 switches protocols and is final.
		if r.status >= 200 || r.status == 101 {
			r.size = off
			return r, nil
		}
	}
}

func parseOne(buf []byte, head bool) (response, error) {
	end := bytes.Index(buf, []byte("\r\n\r\n"))
	if end < 0 {
		if len(buf) > 64<<10 {
			return response{}, fmt.Errorf("%w: no end of headers in %d bytes", errMalformed, len(buf))
		}
		return response{}, nil
	}
	lines := buf[:end]
	line, lines, _ := bytes.Cut(lines, crlf)
	// "HTTP/1.1 200 OK": the version, a space, three digits.
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || line[8] != ' ' {
		return response{}, fmt.Errorf("%w: status line %q", errMalformed, line)
	}
	status, err := strconv.Atoi(string(line[9:12])) // the conversion does not allocate
	if err != nil || status < 100 {
		return response{}, fmt.Errorf("%w: status line %q", errMalformed, line)
	}
	r := response{status: status, keep: line[7] == '1'} // HTTP/1.0 closes unless told otherwise; this parser does not ask

	length, chunked := -1, false
	for len(lines) > 0 {
		line, lines, _ = bytes.Cut(lines, crlf)
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			return response{}, fmt.Errorf("%w: header line %q", errMalformed, line)
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, headerContentLength):
			length, err = strconv.Atoi(string(value))
			if err != nil || length < 0 {
				return response{}, fmt.Errorf("%w: Content-Length %q", errMalformed, value)
			}
		case bytes.EqualFold(name, headerTransferEncoding):
			chunked = containsFold(value, tokenChunked)
		case bytes.EqualFold(name, headerConnection):
			if containsFold(value, tokenClose) {
				r.keep = false
			}
		}
	}
	body := end + 4
	switch {
	case head || status < 200 || status == 204 || status == 304:
		r.size = body
	case chunked:
		n, err := chunkedSize(buf[body:])
		if err != nil || n == 0 {
			return response{}, err
		}
		r.size = body + n
	case length >= 0:
		if len(buf) < body+length {
			return response{}, nil
		}
		r.size = body + length
	default:
		r.size, r.toClose, r.keep = body, true, false
	}
	return r, nil
}

// chunkedSize is the length of the chunked body at the start of buf
// (chunks of a hex size line, the data and CRLF, then a zero-size chunk
// and trailer lines up to an empty one), or 0 while buf does not hold it
// whole.
func chunkedSize(buf []byte) (int, error) {
	off := 0
	for {
		i := bytes.Index(buf[off:], crlf)
		if i < 0 {
			return 0, nil
		}
		size, _, _ := bytes.Cut(buf[off:off+i], []byte(";")) // extensions ignored
		n, err := strconv.ParseInt(string(bytes.TrimSpace(size)), 16, 32)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("%w: chunk size %q", errMalformed, size)
		}
		off += i + 2
		if n == 0 {
			break
		}
		off += int(n) + 2
		if off > len(buf) {
			return 0, nil
		}
	}
	for { // trailers, up to an empty line
		i := bytes.Index(buf[off:], crlf)
		if i < 0 {
			return 0, nil
		}
		off += i + 2
		if i == 0 {
			return off, nil
		}
	}
}

// containsFold tells whether token is one of the comma-separated items of
// a header value, in any case.
func containsFold(value, token []byte) bool {
	for len(value) > 0 {
		var item []byte
		item, value, _ = bytes.Cut(value, []byte(","))
		if bytes.EqualFold(bytes.TrimSpace(item), token) {
			return true
		}
	}
	return false
}
