package lab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"time"

	"github.com/shuntnet/shunt/internal/procstat"
)

// A container's log is the file its shim writes the container's stdout and
// stderr to (kubelet.start), one per container, kept until the pod's
// sandbox goes. The kubelet API serves it as pods/log (containerLogs).

// logOptions are the parts of a pods/log request the lab's logs honour:
// all of PodLogOptions but insecureSkipTLSVerifyBackend (the API server's).
type logOptions struct {
	follow     bool      // keep streaming until the container ends
	fromEnd    bool      // only what comes from now on (attach)
	tail       int64     // the last lines only; -1: all
	limit      int64     // stop after this many bytes; 0: no limit
	timestamps bool      // each line after the time it was written
	since      time.Time // only lines written since (zero: all)
	stream     string    // only this stream's lines (criStdout, criStderr; "": both)
}

// logPoll is how often a followed log is read again for new output.
const logPoll = 200 * time.Millisecond

// parseLogOptions reads pods/log's query as the API server passes it on
// (PodLogOptions: sinceSeconds and sinceTime exclusive).
func parseLogOptions(q url.Values, now time.Time) (logOptions, error) {
	o := logOptions{follow: q.Get("follow") == "true", timestamps: q.Get("timestamps") == "true", tail: -1}
	for name, dst := range map[string]*int64{"tailLines": &o.tail, "limitBytes": &o.limit} {
		if v := q.Get(name); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return o, fmt.Errorf("%s=%q: want a number of at least 0", name, v)
			}
			*dst = n
		}
	}
	if v := q.Get("sinceSeconds"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			return o, fmt.Errorf("sinceSeconds=%q: want a number of at least 1", v)
		}
		o.since = now.Add(-time.Duration(n) * time.Second)
	}
	if v := q.Get("sinceTime"); v != "" {
		if !o.since.IsZero() {
			return o, errors.New("at most one of sinceTime or sinceSeconds may be specified")
		}
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			return o, fmt.Errorf("sinceTime=%q: want an RFC 3339 time: %w", v, err)
		}
		o.since = t
	}
	switch v := q.Get("stream"); v {
	case "", "All":
	case "Stdout":
		o.stream = criStdout
	case "Stderr":
		o.stream = criStderr
	default:
		return o, fmt.Errorf("stream=%q: want All, Stdout or Stderr", v)
	}
	if o.stream != "" && o.tail >= 0 {
		// The API server refuses the two together too.
		return o, errors.New("tailLines and specific stream are mutually exclusive for now")
	}
	return o, nil
}

func (a *KubeletAPI) containerLogs(w http.ResponseWriter, r *http.Request) {
	o, err := parseLogOptions(r.URL.Query(), time.Now())
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	rec, code, err := a.record(r)
	if err != nil {
		http.Error(w, err.Error(), code)
		return
	}
	c, err := rec.container(r.PathValue("container"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	logFile := c.LogFile
	if r.URL.Query().Get("previous") == "true" {
		// The instance before the running one, while its log is kept
		// (until the next restart), as kubelet keeps it.
		if c.Last == nil || c.Last.LogFile == "" {
			http.Error(w, fmt.Sprintf("previous terminated container %q in pod %q not found", c.Name, rec.key()), http.StatusBadRequest)
			return
		}
		logFile, o.follow = c.Last.LogFile, false
	}
	w.Header().Set("Content-Type", "text/plain")
	if err := followLog(r.Context(), c, logFile, o, flushWriter{w}, nil); err != nil && r.Context().Err() == nil {
		a.k.cfg.Log.Warn("kubelet API: serving a container's log", "pod", rec.key(), "container", c.Name, "err", err)
	}
}

// flushWriter sends each write to the client at once (follow).
type flushWriter struct{ w http.ResponseWriter }

func (f flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if fl, ok := f.w.(http.Flusher); ok {
		fl.Flush()
	}
	return n, err
}

// errLogLimit: the byte limit was reached.
var errLogLimit = errors.New("limitBytes reached")

// logSink writes the lines of a log as a pods/log request asks.
type logSink struct {
	o         logOptions
	out, errs io.Writer // errs nil: stderr lines go to out too
	left      int64     // bytes the limit leaves; <0: no limit
}

func (s *logSink) line(l logLine) error {
	if (!s.o.since.IsZero() && !l.time.IsZero() && l.time.Before(s.o.since)) || (s.o.stream != "" && l.stream != s.o.stream) {
		return nil
	}
	var b []byte
	if s.o.timestamps && !l.time.IsZero() {
		b = append(l.time.AppendFormat(b, time.RFC3339Nano), ' ')
	}
	b = append(b, l.content...)
	if !l.partial {
		b = append(b, '\n')
	}
	limited := false
	if s.left >= 0 && int64(len(b)) >= s.left {
		b, limited = b[:s.left], true
	}
	s.left -= int64(len(b))
	w := s.out
	if l.stream == criStderr && s.errs != nil {
		w = s.errs
	}
	if _, err := w.Write(b); err != nil {
		return err
	}
	if limited {
		return errLogLimit
	}
	return nil
}

// followLog writes the container's log (logFile: the running instance's,
// or the previous one's) to out as o asks; errs, if not nil, takes the
// stderr lines (attach).
func followLog(ctx context.Context, c *ContainerRecord, logFile string, o logOptions, out, errs io.Writer) error {
	f, err := os.Open(logFile)
	if err != nil {
		return fmt.Errorf("container %s: opening its log: %w", c.Name, err)
	}
	defer f.Close()
	switch {
	case o.fromEnd:
		if _, err := f.Seek(0, io.SeekEnd); err != nil {
			return err
		}
	case o.tail >= 0:
		off, err := tailOffset(f, o.tail)
		if err != nil {
			return err
		}
		if _, err := f.Seek(off, io.SeekStart); err != nil {
			return err
		}
	}
	sink := &logSink{o: o, out: out, errs: errs, left: -1}
	if o.limit > 0 {
		sink.left = o.limit
	}
	lr := &logReader{br: bufio.NewReader(f), sink: sink}
	for {
		n, err := lr.lines()
		if err != nil {
			return ignoreLimit(err)
		}
		if !o.follow {
			return ignoreLimit(lr.rest())
		}
		if n == 0 && containerEnded(c) {
			// One more read: what it wrote before it ended.
			if _, err := lr.lines(); err != nil {
				return ignoreLimit(err)
			}
			return ignoreLimit(lr.rest())
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(logPoll):
		}
	}
}

func ignoreLimit(err error) error {
	if errors.Is(err, errLogLimit) {
		return nil
	}
	return err
}

// logReader reads a log file's lines as they are written.
type logReader struct {
	br      *bufio.Reader
	sink    *logSink
	pending []byte // a line not yet complete in the file
}

// lines writes the complete lines the file has now; n: bytes read.
func (r *logReader) lines() (n int, err error) {
	for {
		chunk, err := r.br.ReadSlice('\n')
		n += len(chunk)
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			r.pending = append(r.pending, chunk...)
		case err != nil: // io.EOF: the rest, if any, is being written
			r.pending = append(r.pending, chunk...)
			return n, nil
		default:
			line := append(r.pending, chunk[:len(chunk)-1]...)
			r.pending = r.pending[:0]
			if err := r.sink.line(parseLogLine(line)); err != nil {
				return n, err
			}
		}
	}
}

// rest writes a last line that has no newline (a log of an older shim).
func (r *logReader) rest() error {
	if len(r.pending) == 0 {
		return nil
	}
	return r.sink.line(parseLogLine(r.pending))
}

func containerEnded(c *ContainerRecord) bool {
	if _, ok := readExitStatus(c.ExitFile); ok {
		return true
	}
	return !procstat.Running(c.ShimPID)
}

// tailOffset is where the last n lines of f begin (a last line without
// its newline counts).
func tailOffset(f *os.File, n int64) (int64, error) {
	st, err := f.Stat()
	if err != nil {
		return 0, err
	}
	end := st.Size()
	if n == 0 || end == 0 {
		return end, nil
	}
	const chunk = 32 << 10
	buf := make([]byte, chunk)
	// The newline that ends the last line starts no line after it.
	scanEnd := end
	if _, err := f.ReadAt(buf[:1], end-1); err != nil {
		return 0, err
	}
	if buf[0] == '\n' {
		scanEnd--
	}
	pos, lines := scanEnd, int64(0)
	for pos > 0 {
		size := min(int64(chunk), pos)
		pos -= size
		if _, err := f.ReadAt(buf[:size], pos); err != nil && !errors.Is(err, io.EOF) {
			return 0, err
		}
		for i := size - 1; i >= 0; i-- {
			if buf[i] == '\n' {
				if lines++; lines == n {
					return pos + i + 1, nil
				}
			}
		}
	}
	return 0, nil
}
