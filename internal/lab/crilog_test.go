package lab

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
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

// shunt lab logs prints what containers wrote: the CRI format's time,
// stream and tag taken off, partial lines joined, each container's
// instances oldest first.
func TestWriteLogTextAndFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("c.log", "2026-11-27T10:00:00.000000001Z stdout F CapEff:\t0\n2026-11-27T10:00:00.1Z stderr P par\n2026-11-27T10:00:00.2Z stderr F tial\n")
	write("c.2.log", "2026-11-27T10:00:02Z stdout F third\n")
	write("c.1.log", "2026-11-27T10:00:01Z stdout F second\n")
	write("init.log", "not in the CRI format\n")
	names, files, err := ContainerLogFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(names, []string{"c", "init"}) {
		t.Fatalf("names %q, want c and init", names)
	}
	var out bytes.Buffer
	for _, f := range files["c"] {
		if err := WriteLogText(&out, f); err != nil {
			t.Fatal(err)
		}
	}
	if want := "CapEff:\t0\npartial\nsecond\nthird\n"; out.String() != want {
		t.Errorf("text %q, want %q", out.String(), want)
	}
	out.Reset()
	if err := WriteLogText(&out, files["init"][0]); err != nil || out.String() != "not in the CRI format\n" {
		t.Errorf("a line not in the CRI format: %q, %v", out.String(), err)
	}
}
