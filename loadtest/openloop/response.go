package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// errMalformed is a response this reader cannot make sense of; the
// connection it came on is closed, since where the next response starts is
// unknown.
var errMalformed = errors.New("openloop: malformed response")

var (
	headerContentLength    = []byte("content-length")
	headerTransferEncoding = []byte("transfer-encoding")
	headerConnection       = []byte("connection")
	tokenChunked           = []byte("chunked")
	tokenClose             = []byte("close")
)

// readResponse reads one HTTP/1.x response from r and throws its body away.
// It tells the status and whether the connection may carry another
// request (HTTP/1.1 without "Connection: close", and a body whose end was
// known). A response to HEAD (head) has no body whatever its headers say.
//
// It allocates nothing on the common path (ReadSlice hands out the
// reader's own buffer), since at 40,000 requests a second the generator
// shares two cores with the server it measures. A header line longer than
// the reader's buffer is an error.
func readResponse(r *bufio.Reader, head bool) (status int, keep bool, err error) {
	for {
		status, keep, err = readOne(r, head)
		// 1xx answers (100 Continue, 103 Early Hints) come before the
		// real one; 101 switches protocols and is final.
		if err != nil || status >= 200 || status == 101 {
			return status, keep, err
		}
	}
}

func readOne(r *bufio.Reader, head bool) (status int, keep bool, err error) {
	line, err := r.ReadSlice('\n')
	if err != nil {
		return 0, false, err
	}
	// "HTTP/1.1 200 OK\r\n": the version, a space, three digits.
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || line[8] != ' ' {
		return 0, false, fmt.Errorf("%w: status line %q", errMalformed, bytes.TrimSpace(line))
	}
	status, err = strconv.Atoi(string(line[9:12])) // the conversion does not allocate
	if err != nil || status < 100 || status > 999 {
		return 0, false, fmt.Errorf("%w: status line %q", errMalformed, bytes.TrimSpace(line))
	}
	keep = line[7] == '1' // HTTP/1.0 closes unless told otherwise; this reader does not ask

	length, chunked := int64(-1), false
	for {
		line, err = r.ReadSlice('\n')
		if err != nil {
			return 0, false, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			break
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			return 0, false, fmt.Errorf("%w: header line %q", errMalformed, line)
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, headerContentLength):
			length, err = strconv.ParseInt(string(value), 10, 64)
			if err != nil || length < 0 {
				return 0, false, fmt.Errorf("%w: Content-Length %q", errMalformed, value)
			}
		case bytes.EqualFold(name, headerTransferEncoding):
			chunked = containsFold(value, tokenChunked)
		case bytes.EqualFold(name, headerConnection):
			if containsFold(value, tokenClose) {
				keep = false
			}
		}
	}

	switch {
	case head || status < 200 || status == 204 || status == 304:
		return status, keep, nil
	case chunked:
		return status, keep, skipChunked(r)
	case length >= 0:
		_, err = r.Discard(int(length))
		return status, keep, err
	default:
		// No length: the body ends when the server closes.
		_, err = io.Copy(io.Discard, r)
		return status, false, err
	}
}

// skipChunked reads a chunked body to its end: chunks of a hex size line,
// the data and CRLF, then a zero-size chunk and trailer lines up to an
// empty one.
func skipChunked(r *bufio.Reader) error {
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return err
		}
		size, _, _ := bytes.Cut(bytes.TrimRight(line, "\r\n"), []byte(";")) // extensions ignored
		n, err := strconv.ParseInt(string(bytes.TrimSpace(size)), 16, 64)
		if err != nil || n < 0 {
			return fmt.Errorf("%w: chunk size %q", errMalformed, size)
		}
		if n == 0 {
			break
		}
		if _, err := r.Discard(int(n) + 2); err != nil {
			return err
		}
	}
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return err
		}
		if len(bytes.TrimRight(line, "\r\n")) == 0 {
			return nil
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
