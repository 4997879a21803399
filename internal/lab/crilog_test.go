package lab

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shuntnet/shunt/internal/podexec"
)

// The shim's log writer: a line per line, a line longer than criMaxLine
// in pieces (P), the last line without its newline complete, and every
// line read back as written.
func TestCRILogWriter(t *testing.T) {
	var buf bytes.Buffer
	at := time.Date(2026, 11, 27, 8, 0, 0, 123, time.UTC)
	w := &criLogWriter{w: &buf, now: func() time.Time { return at }}
	long := strings.Repeat("x", criMaxLine+10)
	w.copy(criStderr, strings.NewReader("one\n\n"+long+"\nlast"))
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != 5 {
		t.Fatalf("%d lines, want 5 (one, empty, two pieces, last):\n%s", len(lines), buf.String())
	}
	want := []struct {
		content string
		partial bool
	}{{"one", false}, {"", false}, {long[:criMaxLine], true}, {long[criMaxLine:], false}, {"last", false}}
	for i, l := range lines {
		got := parseLogLine([]byte(l))
		if !got.time.Equal(at) || got.stream != criStderr || string(got.content) != want[i].content || got.partial != want[i].partial {
			t.Errorf("line %d %.60q: parsed %v %s partial=%v %.20q", i, l, got.time, got.stream, got.partial, got.content)
		}
	}
	if !strings.HasPrefix(lines[0], "2026-11-27T08:00:00.000000123Z stderr F one") {
		t.Errorf("line 0 %q", lines[0])
	}
	if l := parseLogLine([]byte("not a cri line")); !l.time.IsZero() || string(l.content) != "not a cri line" || l.stream != criStdout {
		t.Errorf("a line of an older shim: %+v", l)
	}
}

// A shim writes its container's stdout and stderr into its log in the
// CRI's format, everything the container wrote before it ended.
func TestShimCRILog(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the shim needs root (mount namespace)")
	}
	dir := t.TempDir()
	logFile, exit := filepath.Join(dir, "c.log"), filepath.Join(dir, "c.exit")
	code := RunShimIn("", exit, logFile, "", podexec.Security{}, ContainerFS{}, []string{"/bin/sh", "-c", "echo out; echo err >&2; printf tail; exit 3"})
	if code != 3 {
		t.Fatalf("exit %d, want 3", code)
	}
	data, _ := os.ReadFile(logFile)
	var got []string
	for line := range strings.Lines(string(data)) {
		l := parseLogLine([]byte(strings.TrimSuffix(line, "\n")))
		if l.time.IsZero() || time.Since(l.time) > time.Minute {
			t.Errorf("line %q has no time of now", line)
		}
		got = append(got, l.stream+" "+string(l.content))
	}
	joined := strings.Join(got, "|")
	for _, want := range []string{"stdout out", "stderr err", "stdout tail"} {
		if !strings.Contains(joined, want) {
			t.Errorf("log %q lacks %q", joined, want)
		}
	}
	if text := string(readLogText(logFile)); !strings.Contains(text, "out\n") || !strings.Contains(text, "tail\n") {
		t.Errorf("readLogText %q", text)
	}
}
