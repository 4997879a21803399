package proxyapi

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// RedirectCodes are the statuses HTTPRequestRedirectFilter allows.
var RedirectCodes = []int{301, 302, 303, 307, 308}

// Problems lists every field of f the proxy will not apply: its text
// (TextProblems), a redirect, rewrite or mirror on a backendRef
// (backendRef), a mirror without a service port or with a share outside
// 0-100, a path that is not absolute, ReplacePrefixMatch in a rule with a
// match that is not a PathPrefix (prefixOnly false), an unknown path
// type, a redirect's scheme other than http or https, a status no
// redirect takes. The agent answers such a rule 500 (internal/l7); the proxy
// refuses a configuration holding one, so both ask here, and a value the
// Gateway API's CRD lets through cannot freeze a node's configuration.
// Nil f: none.
func (f *Filters) Problems(prefixOnly, backendRef bool) []FieldProblem {
	if f == nil {
		return nil
	}
	out := f.TextProblems()
	bad := func(field, format string, args ...any) {
		out = append(out, FieldProblem{field, fmt.Sprintf(format, args...)})
	}
	if backendRef {
		if f.Redirect != nil {
			bad("redirect", "a backendRef takes header modifiers only")
		}
		if f.Rewrite != nil {
			bad("rewrite", "a backendRef takes header modifiers only")
		}
		if len(f.Mirrors) > 0 {
			bad("mirrors", "a backendRef takes header modifiers only")
		}
	}
	for i, m := range f.Mirrors {
		if m.Service == "" || m.Port == 0 {
			bad(fmt.Sprintf("mirrors[%d]", i), "names no service port (service %q, port %d)", m.Service, m.Port)
		}
		if !(m.Percent >= 0 && m.Percent <= 100) {
			bad(fmt.Sprintf("mirrors[%d].percent", i), "%v is not within 0-100", m.Percent)
		}
	}
	path := func(field string, p *PathModifier) {
		switch {
		case p == nil:
		case p.Type == ReplaceFullPath, p.Type == ReplacePrefixMatch && prefixOnly:
			// An empty ReplacePrefixMatch takes the prefix away, as the
			// Gateway API's table has it ("/foo/bar" with "/foo": "/bar").
			if !strings.HasPrefix(p.Value, "/") && !(p.Type == ReplacePrefixMatch && p.Value == "") {
				bad(field+".value", "%q must start with /", p.Value)
			}
		case p.Type == ReplacePrefixMatch:
			bad(field+".type", "ReplacePrefixMatch needs every match of the rule to be a PathPrefix")
		default:
			bad(field+".type", "%q: use ReplaceFullPath or ReplacePrefixMatch", p.Type)
		}
	}
	if rd := f.Redirect; rd != nil {
		if rd.Scheme != "" && rd.Scheme != "http" && rd.Scheme != "https" {
			bad("redirect.scheme", "%q: use http or https", rd.Scheme)
		}
		if rd.StatusCode != 0 && !slices.Contains(RedirectCodes, rd.StatusCode) {
			bad("redirect.statusCode", "%d: use one of %v", rd.StatusCode, RedirectCodes)
		}
		path("redirect.path", rd.Path)
	}
	if rw := f.Rewrite; rw != nil {
		path("rewrite.path", rw.Path)
	}
	return out
}

// Anchored compiles an RE2 regular expression that must match the whole
// value, as the proxy matches paths, headers and query parameters.
func Anchored(expr string) (*regexp.Regexp, error) {
	if _, err := regexp.Compile(expr); err != nil {
		return nil, err // the error quotes the expression as given
	}
	return regexp.Compile(`^(?:` + expr + `)$`)
}

// Problems lists the fields of m the proxy cannot match requests with: a
// path that is not absolute, a regular expression RE2 cannot compile (the
// Gateway API's CRD checks neither syntax: RegularExpression is left to
// implementations), an unknown type, a method that is not a token, a
// header or query parameter without a name. Fields are relative to the
// match ("path.value", "headers[0].type").
func (m Match) Problems() []FieldProblem {
	var out []FieldProblem
	bad := func(field, format string, args ...any) {
		out = append(out, FieldProblem{field, fmt.Sprintf(format, args...)})
	}
	if p := m.Path; p != nil {
		switch p.Type {
		case MatchExact, MatchPathPrefix:
			if !strings.HasPrefix(p.Value, "/") {
				bad("path.value", "%q must start with /", p.Value)
			}
		case MatchRegularExpr:
			if _, err := Anchored(p.Value); err != nil {
				bad("path.value", "%q is not an RE2 regular expression: %v", p.Value, err)
			}
		default:
			bad("path.type", "%q: use Exact, PathPrefix or RegularExpression", p.Type)
		}
	}
	if m.Method != "" && !isToken(m.Method) {
		bad("method", "%q is not an HTTP method", m.Method)
	}
	for _, list := range []struct {
		field   string
		matches []HeaderMatch
	}{{"headers", m.Headers}, {"queryParams", m.Query}} {
		for i, h := range list.matches {
			field := fmt.Sprintf("%s[%d]", list.field, i)
			if h.Name == "" {
				bad(field+".name", "required")
				continue
			}
			switch h.Type {
			case "", MatchExact:
			case MatchRegularExpr:
				if _, err := Anchored(h.Value); err != nil {
					bad(field+".value", "%q is not an RE2 regular expression: %v", h.Value, err)
				}
			default:
				bad(field+".type", "%q: use Exact or RegularExpression", h.Type)
			}
		}
	}
	return out
}

// PrefixOnly says whether every match of rr is a PathPrefix (no path is
// "/" as a prefix), which a ReplacePrefixMatch filter needs.
func (rr RouteRule) PrefixOnly() bool {
	return !slices.ContainsFunc(rr.Matches, func(m Match) bool {
		return m.Path != nil && m.Path.Type != MatchPathPrefix
	})
}

func isToken(s string) bool {
	return !strings.ContainsFunc(s, func(r rune) bool { return !IsTokenChar(r) })
}
