package lab

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/shuntnet/shunt/internal/atomicfile"
	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
	"github.com/shuntnet/shunt/internal/parallel"
)

// objectLog persists the desired objects as a snapshot plus an append-only
// journal: applying one object of 20 000 appends one line, while a bulk
// apply (or a journal grown past a quarter of the objects) rewrites the
// snapshot and starts an empty journal. Loading reads the snapshot and
// replays the journal.
type objectLog struct {
	dir     string
	journal int // entries appended since the snapshot
}

// logEntry is one object in the snapshot or the journal; in the journal an
// entry without object records a deletion.
type logEntry struct {
	Key    string          `json:"key"`
	Source string          `json:"source,omitempty"`
	Object json.RawMessage `json:"object,omitempty"`
}

// Thresholds for rewriting the snapshot instead of appending.
const (
	bulkChange     = 256
	minJournalSize = 1024
)

func (l *objectLog) snapshotPath() string { return filepath.Join(l.dir, "objects.json") }
func (l *objectLog) journalPath() string  { return filepath.Join(l.dir, "objects.journal") }

// load returns the persisted objects sorted by key.
func (l *objectLog) load() ([]StoredObject, error) {
	objs := map[string]logEntry{}
	data, err := os.ReadFile(l.snapshotPath())
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if err == nil {
		var snap []logEntry
		if err := json.Unmarshal(data, &snap); err != nil {
			return nil, fmt.Errorf("reading %s: %w (remove the lab with `shunt uninstall` if it is damaged)", l.snapshotPath(), err)
		}
		for _, e := range snap {
			objs[e.Key] = e
		}
	}
	journal, err := os.ReadFile(l.journalPath())
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	l.journal = 0
	sc := bufio.NewScanner(bytes.NewReader(journal))
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var e logEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			// A torn last line is a write that never finished, so never
			// acknowledged: stop there. Anything else is damage.
			if !bytes.HasSuffix(journal, []byte("\n")) && bytes.HasSuffix(journal, sc.Bytes()) {
				break
			}
			return nil, fmt.Errorf("reading %s: %w (remove the lab with `shunt uninstall` if it is damaged)", l.journalPath(), err)
		}
		if e.Object == nil {
			delete(objs, e.Key)
		} else {
			objs[e.Key] = e
		}
		l.journal++
	}
	keys := make([]string, 0, len(objs))
	for k := range objs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]StoredObject, len(keys))
	for i, k := range keys {
		out[i] = StoredObject{Source: objs[k].Source, Object: objs[k].Object}
	}
	return out, nil
}

func entryFor(store *model.Store, key manifest.Key) (logEntry, error) {
	o, ok := store.Get(key)
	if !ok {
		return logEntry{Key: key.String()}, nil
	}
	raw, err := json.Marshal(o.Obj)
	if err != nil {
		return logEntry{}, fmt.Errorf("encoding %s: %w", key, err)
	}
	return logEntry{Key: key.String(), Source: o.Source, Object: raw}, nil
}

// save records the changed keys of store.
func (l *objectLog) save(store *model.Store, changed []manifest.Key) error {
	if len(changed) == 0 {
		return nil
	}
	if len(changed) > bulkChange || l.journal+len(changed) > max(minJournalSize, store.Len()/4) {
		return l.snapshot(store)
	}
	var buf bytes.Buffer
	for _, key := range changed {
		e, err := entryFor(store, key)
		if err != nil {
			return err
		}
		line, err := json.Marshal(e)
		if err != nil {
			return err
		}
		buf.Write(line)
		buf.WriteByte('\n')
	}
	f, err := os.OpenFile(l.journalPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(buf.Bytes())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("appending to %s: %w", l.journalPath(), err)
	}
	l.journal += len(changed)
	return nil
}

// snapshotLine encodes one logEntry. Written out by hand because
// json.Marshal would scan the encoded object a second time.
func snapshotLine(o manifest.Object) ([]byte, error) {
	obj, err := json.Marshal(o.Obj)
	if err != nil {
		return nil, fmt.Errorf("encoding %s: %w", o.Key().String(), err)
	}
	key, _ := json.Marshal(o.Key().String())
	src, _ := json.Marshal(o.Source)
	line := make([]byte, 0, len(obj)+len(key)+len(src)+32)
	line = append(append(append(line, `{"key":`...), key...), `,"source":`...)
	line = append(append(append(line, src...), `,"object":`...), obj...)
	return append(line, '}'), nil
}

// snapshot rewrites every object and empties the journal. Objects are
// encoded on every CPU: 20 000 of them take a quarter of a second on one.
func (l *objectLog) snapshot(store *model.Store) error {
	objs := store.Objects()
	lines := make([][]byte, len(objs))
	errs := make([]error, len(objs))
	parallel.For(len(objs), func(i int) {
		lines[i], errs[i] = snapshotLine(objs[i])
	})
	if err := errors.Join(errs...); err != nil {
		return err
	}
	size := 2
	for _, line := range lines {
		size += len(line) + 2
	}
	data := make([]byte, 0, size)
	data = append(data, '[')
	for i, line := range lines {
		if i > 0 {
			data = append(data, ",\n"...)
		}
		data = append(data, line...)
	}
	data = append(data, "]\n"...)
	if err := atomicfile.Write(l.snapshotPath(), data); err != nil {
		return err
	}
	if err := os.Remove(l.journalPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	l.journal = 0
	return nil
}

// StoredObject is a persisted object with where it came from.
type StoredObject struct {
	Source string          `json:"source"`
	Object json.RawMessage `json:"object"`
}

// decodeObjects parses persisted objects with the same strict decoder as
// files, so both go through one set of checks.
func decodeObjects(stored []StoredObject) ([]manifest.Object, error) {
	docs := make([]manifest.Document, len(stored))
	for i, so := range stored {
		docs[i] = manifest.Document{Source: so.Source, JSON: so.Object}
	}
	return manifest.Decode(docs)
}
