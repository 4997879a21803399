package lab

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Container logs in the CRI's format (what containerd and CRI-O write and
// kubelet reads, k8s.io/cri-api's LogTag): a line per line of output,
//
//	2026-11-27T08:50:01.123456789Z stdout F the line
//
// with the time it was read, the stream, and F (the line is complete) or P
// (a piece of a line longer than criMaxLine; the rest follows). The shim
// writes them (its container's stdout and stderr are pipes it reads), so
// kubectl logs can show times (--timestamps), select by time (--since,
// --since-time) and by stream. A line that is not in this format (a log
// an older shim wrote) is read as a complete line of stdout without a
// time.

const (
	criStdout = "stdout"
	criStderr = "stderr"
	// criMaxLine is containerd's: longer lines are written in pieces.
	criMaxLine = 16 << 10
)

// criLogWriter writes the lines of a container's streams into its log.
type criLogWriter struct {
	mu  sync.Mutex
	w   io.Writer
	now func() time.Time
}

// line writes one line (or piece of one) of stream.
func (l *criLogWriter) line(stream string, content []byte, partial bool) {
	tag := " F "
	if partial {
		tag = " P "
	}
	var b bytes.Buffer
	b.Grow(len(content) + 48)
	b.WriteString(l.now().UTC().Format(time.RFC3339Nano))
	b.WriteByte(' ')
	b.WriteString(stream)
	b.WriteString(tag)
	b.Write(content)
	b.WriteByte('\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	l.w.Write(b.Bytes())
}

// copy writes what r gives as lines of stream until r ends; a last line
// without its newline is written complete, as containerd does.
func (l *criLogWriter) copy(stream string, r io.Reader) {
	br := bufio.NewReaderSize(r, criMaxLine)
	for {
		line, err := br.ReadSlice('\n')
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			l.line(stream, line, true)
			continue
		case len(line) > 0:
			l.line(stream, bytes.TrimSuffix(line, []byte{'\n'}), false)
		}
		if err != nil {
			return
		}
	}
}

// logLine is one line of a container's log as read back.
type logLine struct {
	time    time.Time // zero: not known (not in the CRI format)
	stream  string
	partial bool
	content []byte
}

// parseLogLine reads one line of a log file (without its newline).
func parseLogLine(line []byte) logLine {
	raw := logLine{stream: criStdout, content: line}
	ts, rest, ok := bytes.Cut(line, []byte{' '})
	if !ok {
		return raw
	}
	t, err := time.Parse(time.RFC3339Nano, string(ts))
	if err != nil {
		return raw
	}
	stream, rest, ok := bytes.Cut(rest, []byte{' '})
	if !ok || (string(stream) != criStdout && string(stream) != criStderr) {
		return raw
	}
	tag, content, ok := bytes.Cut(rest, []byte{' '})
	if !ok {
		// An empty line's content may lack the space after the tag.
		tag, content = rest, nil
	}
	if string(tag) != "F" && string(tag) != "P" {
		return raw
	}
	return logLine{time: t, stream: string(stream), partial: string(tag) == "P", content: content}
}

// readLogText is the text of a log file as its container wrote it (the
// lines' content), for messages.
func readLogText(path string) []byte {
	var out bytes.Buffer
	if err := WriteLogText(&out, path); err != nil {
		return nil
	}
	return out.Bytes()
}

// WriteLogText writes the text of a container's log file as the container
// wrote it: the content of its lines without the CRI format's time,
// stream and tag, partial lines joined (`shunt lab logs`).
func WriteLogText(w io.Writer, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	br := bufio.NewReader(f)
	bw := bufio.NewWriter(w)
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			l := parseLogLine(bytes.TrimSuffix(line, []byte{'\n'}))
			bw.Write(l.content)
			if !l.partial {
				bw.WriteByte('\n')
			}
		}
		if err == io.EOF {
			return bw.Flush()
		}
		if err != nil {
			bw.Flush()
			return err
		}
	}
}

// ContainerLogFiles are the log files of a pod's containers, init
// containers' first, by container name, each container's instances
// oldest first (a restarted container's later instances are NAME.N.log).
func ContainerLogFiles(podDir string) (names []string, files map[string][]string, err error) {
	paths, err := filepath.Glob(filepath.Join(podDir, "*.log"))
	if err != nil {
		return nil, nil, err
	}
	type instance struct {
		n    int
		path string
	}
	byName := map[string][]instance{}
	for _, p := range paths {
		base := strings.TrimSuffix(filepath.Base(p), ".log")
		name, n := base, 0
		if i := strings.LastIndexByte(base, '.'); i > 0 {
			if k, err := strconv.Atoi(base[i+1:]); err == nil {
				name, n = base[:i], k
			}
		}
		if _, ok := byName[name]; !ok {
			names = append(names, name)
		}
		byName[name] = append(byName[name], instance{n, p})
	}
	files = map[string][]string{}
	for name, in := range byName {
		slices.SortFunc(in, func(a, b instance) int { return a.n - b.n })
		for _, i := range in {
			files[name] = append(files[name], i.path)
		}
	}
	return names, files, nil
}
