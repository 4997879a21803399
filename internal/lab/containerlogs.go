package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"time"
)

// A container's log is the file its shim writes the container's stdout and
// stderr to (kubelet.start), one per container, kept until the pod's
// sandbox goes. The kubelet API serves it as pods/log (containerLogs).

// logOptions are the parts of a pods/log request the lab's logs honour.
type logOptions struct {
	follow  bool  // keep streaming until the container ends
	fromEnd bool  // only what comes from now on (attach)
	tail    int64 // the last lines only; -1: all
	limit   int64 // stop after this many bytes; 0: no limit
}

// logPoll is how often a followed log is read again for new output.
const logPoll = 200 * time.Millisecond

func (a *KubeletAPI) containerLogs(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	o := logOptions{follow: q.Get("follow") == "true", tail: -1}
	for name, dst := range map[string]*int64{"tailLines": &o.tail, "limitBytes": &o.limit} {
		if v := q.Get(name); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				http.Error(w, fmt.Sprintf("%s=%q: want a number of at least 0", name, v), http.StatusBadRequest)
				return
			}
			*dst = n
		}
	}
	for _, name := range []string{"timestamps", "sinceSeconds", "sinceTime"} {
		if v := q.Get(name); v != "" && v != "false" {
			// The shim writes the container's output to the file as it
			// comes, with no time of each line to select or show by.
			http.Error(w, fmt.Sprintf("%s is not supported: the lab's container logs record no times", name), http.StatusBadRequest)
			return
		}
	}
	rec, code, err := a.record(r)
	if err != nil {
		http.Error(w, err.Error(), code)
		return
	}
	if q.Get("previous") == "true" {
		// The lab starts a container once per sandbox and keeps no log of
		// an earlier one, as kubelet answers for a container never
		// restarted.
		http.Error(w, fmt.Sprintf("previous terminated container %q in pod %q not found", r.PathValue("container"), rec.key()), http.StatusBadRequest)
		return
	}
	c, err := rec.container(r.PathValue("container"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	if err := followLog(r.Context(), c, o, flushWriter{w}); err != nil && r.Context().Err() == nil {
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

// followLog writes the container's log to w as o asks.
func followLog(ctx context.Context, c *ContainerRecord, o logOptions, w io.Writer) error {
	f, err := os.Open(c.LogFile)
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
	var src io.Reader = f
	if o.limit > 0 {
		src = io.LimitReader(f, o.limit)
	}
	for {
		n, err := io.Copy(w, src)
		if err != nil {
			return err
		}
		if !o.follow || (o.limit > 0 && src.(*io.LimitedReader).N == 0) {
			return nil
		}
		if n == 0 && containerEnded(c) {
			// One more read: what it wrote before it ended.
			_, err := io.Copy(w, src)
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(logPoll):
		}
	}
}

func containerEnded(c *ContainerRecord) bool {
	if _, ok := readExitStatus(c.ExitFile); ok {
		return true
	}
	return !processAlive(c.ShimPID)
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
