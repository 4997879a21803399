package proxyapi

import (
	"fmt"
	"strings"
)

// The text a filter writes into heads: header names and values, the Host
// and path of a rewrite, the Location of a redirect. A CR or LF there
// would end the line it is written in, and the rest would be read as a
// header of its own (request smuggling, response splitting); a NUL or
// another control byte is refused by some peers and read as data by
// others. Both the agent (internal/l7, which answers such a rule 500) and
// the proxy (which refuses a configuration holding one) check it here.

// FieldProblem is one field of a filter the proxy will not write;
// Field is relative to the Filters ("requestHeaders.set[0].value").
type FieldProblem struct {
	Field, Message string
}

func (p FieldProblem) String() string { return p.Field + ": " + p.Message }

// TextProblems lists the fields of f whose text may not be written into
// an HTTP head: header names that are not tokens (RFC 9110 §5.6.2),
// values, hostnames and paths with a control byte (below 0x20 but the
// horizontal tab, or DEL 0x7f; RFC 9110 §5.5). Nil f: none.
func (f *Filters) TextProblems() []FieldProblem {
	if f == nil {
		return nil
	}
	var out []FieldProblem
	bad := func(field, problem string) { out = append(out, FieldProblem{field, problem}) }
	for _, hm := range []struct {
		field string
		m     *HeaderModifier
	}{{"requestHeaders", f.RequestHeaders}, {"responseHeaders", f.ResponseHeaders}} {
		if hm.m == nil {
			continue
		}
		for _, list := range []struct {
			field   string
			headers []Header
		}{{"set", hm.m.Set}, {"add", hm.m.Add}} {
			for i, h := range list.headers {
				field := fmt.Sprintf("%s.%s[%d]", hm.field, list.field, i)
				if why := NotToken(h.Name); why != "" {
					bad(field+".name", why)
				}
				if why := ControlByte(h.Value); why != "" {
					bad(field+".value", why)
				}
			}
		}
		for i, name := range hm.m.Remove {
			if why := NotToken(name); why != "" {
				bad(fmt.Sprintf("%s.remove[%d]", hm.field, i), why)
			}
		}
	}
	text := func(field, s string) {
		if why := ControlByte(s); why != "" {
			bad(field, why)
		}
	}
	if rd := f.Redirect; rd != nil {
		text("redirect.hostname", rd.Hostname)
		if rd.Path != nil {
			text("redirect.path.value", rd.Path.Value)
		}
	}
	if rw := f.Rewrite; rw != nil {
		text("rewrite.hostname", rw.Hostname)
		if rw.Path != nil {
			text("rewrite.path.value", rw.Path.Value)
		}
	}
	return out
}

// ControlByte says where s holds a byte no header field value, request
// target or Location may hold (a control byte but the horizontal tab, or
// DEL), and what the value would do written into a head; "" when it holds
// none.
func ControlByte(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' && c != '\t' || c == 0x7f {
			return fmt.Sprintf("%q has %s at byte %d: refused, written into a head it %s", s, byteName(c), i, controlEffect(c))
		}
	}
	return ""
}

// NotToken says why name is not an HTTP field name (a token: letters,
// digits and !#$%&'*+-.^_`|~); "" when it is one.
func NotToken(name string) string {
	if name == "" {
		return "empty: a header name is required"
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !IsTokenChar(rune(c)) {
			what := fmt.Sprintf("%q", c)
			if c < ' ' || c == 0x7f {
				what = byteName(c)
			}
			return fmt.Sprintf("%q is not a header name: it has %s at byte %d, a name is a token (letters, digits and !#$%%&'*+-.^_`|~)", name, what, i)
		}
	}
	return ""
}

// IsTokenChar says whether r may be part of a token (RFC 9110 §5.6.2).
func IsTokenChar(r rune) bool {
	return 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", r)
}

func byteName(c byte) string {
	switch c {
	case '\r':
		return "a CR (0x0d)"
	case '\n':
		return "an LF (0x0a)"
	case 0:
		return "a NUL (0x00)"
	case 0x7f:
		return "a DEL (0x7f)"
	}
	return fmt.Sprintf("the control byte %#02x", c)
}

func controlEffect(c byte) string {
	if c == '\r' || c == '\n' {
		return "would end the line and start a header of its own (request smuggling, response splitting)"
	}
	return "is refused by some peers and taken as data by others"
}
