package proxy

import (
	"bytes"
	"errors"
	"net/http"
	"net/textproto"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// The fast path's HTTP/1.1 parsing: strict on purpose. A request head it
// does not fully understand is not an error: the connection goes to
// net/http, which answers it as before (and refuses what is malformed).

// maxFastHeaders bounds the header lines of a fast-path request.
const maxFastHeaders = 100

// headStatus says what the bytes read so far hold.
type headStatus int

const (
	headIncomplete headStatus = iota // no end of head yet
	headComplete                     // a whole head, ending at n
	headRefused                      // not for the fast path: hand the connection to net/http
)

// findHead looks for the end of a head (an empty line) in buf, line by
// line: every line must end in CRLF, a bare LF refuses at once (a client
// that uses bare LFs never sends the CRLFCRLF we would wait for).
func findHead(buf []byte) (n int, st headStatus) {
	for pos := 0; ; {
		i := bytes.IndexByte(buf[pos:], '\n')
		if i < 0 {
			return 0, headIncomplete
		}
		end := pos + i
		if end == 0 || buf[end-1] != '\r' {
			return 0, headRefused
		}
		if end-1 == pos { // an empty line
			if pos == 0 {
				return 0, headRefused // a CRLF before the request line
			}
			return end + 1, headComplete
		}
		pos = end + 1
	}
}

// fastRequest is a request head parsed for the fast path. Its fields and
// the http.Request the decision code reads are reused from one request of
// the connection to the next: nothing keeps them past the exchange (the
// flow record copies its strings, which are substrings of text).
type fastRequest struct {
	text string // the head as received, one allocation per request
	req  http.Request
	url  url.URL
	vals []string // backing of the header values

	forward       []span // the header lines to send upstream, CRLF included
	contentLength int64
	close         bool // Connection: close
}

// span is a part of text: [start, end).
type span struct{ start, end int }

// parse fills r from one request head (text, ending with its empty
// line). ok is false for anything the fast path leaves to net/http: not
// HTTP/1.1, not origin-form, no or several Host, Transfer-Encoding, Upgrade,
// Expect, TE, Trailer, Connection options other than close and keep-alive,
// obsolete line folding, bytes net/http would refuse, too many headers.
func (r *fastRequest) parse(text string) (ok bool) {
	r.text = text
	r.forward = r.forward[:0]
	r.vals = r.vals[:0]
	r.contentLength, r.close = 0, false
	if r.req.Header == nil {
		r.req.Header = http.Header{}
	}
	clear(r.req.Header)

	eol := strings.Index(text, "\r\n")
	line := text[:eol]
	sp1 := strings.IndexByte(line, ' ')
	if sp1 <= 0 || !isToken(line[:sp1]) {
		return false
	}
	method, rest := line[:sp1], line[sp1+1:]
	sp2 := strings.IndexByte(rest, ' ')
	if sp2 <= 0 || rest[sp2+1:] != "HTTP/1.1" {
		return false
	}
	target := rest[:sp2]
	if target[0] != '/' || !visibleASCII(target) {
		return false
	}
	r.url = url.URL{}
	path, query, _ := strings.Cut(target, "?")
	if strings.IndexByte(target, '%') >= 0 || strings.IndexByte(target, '#') >= 0 {
		u, err := url.ParseRequestURI(target) // decoding as net/http does
		if err != nil {
			return false
		}
		r.url = *u
	} else {
		r.url.Path, r.url.RawQuery = path, query
	}

	host, hosts, lengths := "", 0, 0
	for pos := eol + 2; pos < len(text)-2; {
		end := pos + strings.Index(text[pos:], "\r\n")
		line := text[pos:end]
		lineSpan := span{pos, end + 2}
		pos = end + 2
		colon := strings.IndexByte(line, ':')
		if colon <= 0 || !isToken(line[:colon]) {
			return false // also obsolete folding: a line starting with a space
		}
		value := strings.Trim(line[colon+1:], " \t")
		if !validFieldValue(value) {
			return false
		}
		if len(r.vals) == maxFastHeaders {
			return false
		}
		key := line[:colon]
		if !isCanonical(key) {
			key = textproto.CanonicalMIMEHeaderKey(key)
		}
		forward := true
		switch key {
		case "Host":
			host, hosts, forward = value, hosts+1, true
		case "Content-Length":
			n, err := strconv.ParseInt(value, 10, 64)
			if err != nil || n < 0 || value[0] == '+' {
				return false
			}
			r.contentLength, lengths = n, lengths+1
		case "Connection":
			for opt := range strings.SplitSeq(value, ",") {
				switch strings.ToLower(strings.TrimSpace(opt)) {
				case "close":
					r.close = true
				case "keep-alive", "":
				default:
					return false // upgrade, or headers named as hop-by-hop
				}
			}
			forward = false
		case "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Proxy-Authorization":
			forward = false // hop-by-hop, as net/http's reverse proxy drops them
		case "Transfer-Encoding", "Upgrade", "Expect", "Te", "Trailer":
			return false
		}
		if forward {
			r.forward = append(r.forward, lineSpan)
		}
		if key == "Host" {
			continue // net/http keeps Host out of the header map
		}
		r.vals = append(r.vals, value)
		if vs := r.req.Header[key]; vs == nil {
			r.req.Header[key] = r.vals[len(r.vals)-1 : len(r.vals) : len(r.vals)] // no allocation
		} else {
			r.req.Header[key] = append(vs, value)
		}
	}
	if hosts != 1 || lengths > 1 || !validHost(host) {
		return false
	}
	r.req = http.Request{
		Method: method, URL: &r.url, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: r.req.Header, Host: host, RequestURI: target, ContentLength: r.contentLength,
		Body: http.NoBody, Close: r.close,
	}
	return true
}

// requestLine is the request line of text, without its CRLF.
func (r *fastRequest) requestLine() string { return r.text[:strings.Index(r.text, "\r\n")] }

func visibleASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

// validFieldValue is net/http's rule: no control characters but tab.
func validFieldValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

func validHost(h string) bool {
	return h != "" && !strings.ContainsAny(h, " /?#@\\")
}

// isCanonical says whether a header name is already in canonical form
// (Content-Length), the usual case: then no new string is made.
func isCanonical(s string) bool {
	upper := true
	for i := 0; i < len(s); i++ {
		c := s[i]
		if upper && 'a' <= c && c <= 'z' || !upper && 'A' <= c && c <= 'Z' {
			return false
		}
		upper = c == '-'
	}
	return true
}

// fastResponse is an upstream response head, parsed.
type fastResponse struct {
	status        int
	contentLength int64 // -1: none given
	chunked       bool
	close         bool // the upstream connection ends after this response
	forward       []span
	text          []byte
}

var errBadResponse = errors.New("malformed HTTP/1.x response head")

// parse reads an upstream response head (text: through its empty line).
// Hop-by-hop headers are dropped for the client; Transfer-Encoding:
// chunked is kept, since the body is passed on with its own framing.
func (r *fastResponse) parse(text []byte) error {
	r.text = text
	r.forward = r.forward[:0]
	r.contentLength, r.chunked, r.close = -1, false, false
	var lengthBuf [2]int
	lengthLines := lengthBuf[:0] // indexes in forward
	eol := bytes.Index(text, crlf)
	line := text[:eol]
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || line[8] != ' ' ||
		(len(line) > 12 && line[12] != ' ') {
		return errBadResponse
	}
	switch line[7] {
	case '1':
	case '0':
		r.close = true // keep-alive for HTTP/1.0 is not used upstream
	default:
		return errBadResponse
	}
	code, err := strconv.Atoi(string(line[9:12]))
	if err != nil || code < 100 || code > 999 {
		return errBadResponse
	}
	r.status = code
	for pos := eol + 2; pos < len(text)-2; {
		end := pos + bytes.Index(text[pos:], crlf)
		line := text[pos:end]
		lineSpan := span{pos, end + 2}
		pos = end + 2
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 {
			return errBadResponse
		}
		name, value := line[:colon], bytes.Trim(line[colon+1:], " \t")
		forward := true
		switch {
		case asciiEqualFold(name, "Content-Length"):
			lengthLines = append(lengthLines, len(r.forward))
			n, err := strconv.ParseInt(string(value), 10, 64)
			if err != nil || n < 0 || (r.contentLength >= 0 && n != r.contentLength) {
				return errBadResponse
			}
			r.contentLength = n
		case asciiEqualFold(name, "Transfer-Encoding"):
			if !asciiEqualFold(value, "chunked") {
				return errors.New("the upstream response uses a transfer coding other than chunked")
			}
			r.chunked = true
		case asciiEqualFold(name, "Connection"):
			for opt := range bytes.SplitSeq(value, []byte(",")) {
				if asciiEqualFold(bytes.TrimSpace(opt), "close") {
					r.close = true
				}
			}
			forward = false
		case asciiEqualFold(name, "Keep-Alive"), asciiEqualFold(name, "Proxy-Connection"), asciiEqualFold(name, "Upgrade"):
			forward = false
		}
		if forward {
			r.forward = append(r.forward, lineSpan)
		}
	}
	if r.chunked && len(lengthLines) > 0 {
		// Chunked wins, as RFC 9112 says, and the client must not see both.
		r.contentLength = -1
		for i := len(lengthLines) - 1; i >= 0; i-- {
			r.forward = slices.Delete(r.forward, lengthLines[i], lengthLines[i]+1)
		}
	}
	return nil
}

var crlf = []byte("\r\n")

func asciiEqualFold[T string | []byte](b T, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := 0; i < len(b); i++ {
		c, d := b[i], s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if 'A' <= d && d <= 'Z' {
			d += 'a' - 'A'
		}
		if c != d {
			return false
		}
	}
	return true
}

// parseChunkSize reads a chunk-size line (without its CRLF): hex digits,
// then optional extensions.
func parseChunkSize(line []byte) (int64, error) {
	if i := bytes.IndexByte(line, ';'); i >= 0 {
		line = line[:i]
	}
	line = bytes.TrimRight(line, " \t")
	if len(line) == 0 || len(line) > 15 {
		return 0, errors.New("bad chunk size line")
	}
	var n int64
	for _, c := range line {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, errors.New("bad chunk size line")
		}
		n = n<<4 | int64(c)
	}
	return n, nil
}

// bodyless says whether a response to method with status has no body.
func bodyless(method string, status int) bool {
	return method == http.MethodHead || status/100 == 1 || status == http.StatusNoContent || status == http.StatusNotModified
}
