package manifest

import (
	"fmt"
	"strings"
)

// FieldError is one problem with one field of one manifest object.
type FieldError struct {
	Source  string // "file.yaml#2", "<stdin>#1", or a path that could not be read
	Object  string // "Pod default/web", "Namespace prod"; empty when the document has no usable kind
	Field   string // JSON path, e.g. "spec.containers[0].command"; empty when not known
	Message string
}

// Error formats the problem as "file.yaml#2: Pod default/web: spec.x: message",
// leaving out the parts that are not known.
func (e FieldError) Error() string {
	parts := make([]string, 0, 4)
	for _, s := range []string{e.Source, e.Object, e.Field, e.Message} {
		if s != "" {
			parts = append(parts, s)
		}
	}
	return strings.Join(parts, ": ")
}

// Errors is every problem found while reading or validating manifests.
// Load, Parse and Validate return it (as *Errors) so callers can report
// all problems at once instead of fixing them one run at a time.
type Errors struct {
	List []FieldError
}

// MaxShown is how many problems an error message lists; the rest are
// counted (a generated file with one mistake repeated 10 000 times should
// not print 10 000 lines).
const MaxShown = 50

// Error prints one problem per line, at most MaxShown of them.
func (e *Errors) Error() string {
	lines := make([]string, 0, min(len(e.List), MaxShown+1))
	for i, fe := range e.List {
		if i == MaxShown {
			lines = append(lines, fmt.Sprintf("... and %d more", len(e.List)-MaxShown))
			break
		}
		lines = append(lines, fe.Error())
	}
	return strings.Join(lines, "\n")
}

// JoinProblems formats a list of problems under a heading, one per line, at
// most MaxShown of them.
func JoinProblems(heading string, problems []string) string {
	if n := len(problems); n > MaxShown {
		problems = append(problems[:MaxShown:MaxShown], fmt.Sprintf("... and %d more", n-MaxShown))
	}
	return heading + "\n" + strings.Join(problems, "\n")
}

func (e *Errors) add(source, object, field, format string, args ...any) {
	e.List = append(e.List, FieldError{source, object, field, fmt.Sprintf(format, args...)})
}

// orNil returns e as an error, or a plain nil when there is nothing to
// report (a nil *Errors in an error interface would not compare equal to nil).
func (e *Errors) orNil() error {
	if e == nil || len(e.List) == 0 {
		return nil
	}
	return e
}

// objectLabel names an object in messages: "Pod default/web", "Namespace prod".
func objectLabel(kind, ns, name string) string {
	switch {
	case name == "":
		return kind + " (unnamed)"
	case ns == "":
		return kind + " " + name
	default:
		return kind + " " + ns + "/" + name
	}
}
