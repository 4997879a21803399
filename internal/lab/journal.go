package lab

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"sort"

	"github.com/shuntnet/shunt/internal/atomicfile"
	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
	"github.com/shuntnet/shunt/internal/parallel"
)

// objectLog persists the desired objects as a snapshot plus an append-only
// journal: applying one object of 20 000 appends one record, while a bulk
// apply (or a journal grown past a quarter of the objects) rewrites the
// snapshot and starts an empty journal. Loading reads the snapshot and
// replays the journal.
//
// Every committed change (one apply, one delete, one status write: a
// batch) is atomic on disk, and durable before the API answers:
//
//   - The journal holds one record per batch, appended with one write to
//     an O_APPEND file and fsync'd:
//     "B" crc32c(payload) " " len(payload) " " payload "\n", both numbers
//     as 8 lowercase hex digits, the payload one JSON line
//     {"seq":N,"entries":[logEntry...]}. A crash leaves at most the last
//     record torn; it was never acknowledged, so loading drops it and cuts
//     the file back to the last whole record. A damaged record that good
//     records follow is not a torn write but damage: loading refuses it,
//     naming the file and the offset, rather than start with a part of the
//     changes.
//   - The snapshot is written to a temporary file, fsync'd and renamed
//     (atomicfile), and starts with a header line
//     "# shunt objects v2 seq=N len=L crc32c=C" over the JSON array that
//     follows. Its seq is the last batch it holds: journal records up to
//     it are skipped, so a crash after the rename but before the journal
//     is removed does not replay older changes over newer ones.
//
// Older versions wrote a bare JSON array as snapshot and one JSON line per
// object in the journal (a multi-object apply was several lines, not
// atomic). Both are still read, so an upgrade keeps the lab; the next save
// rewrites them in the new format (one way: older versions cannot read it).
type objectLog struct {
	dir     string
	journal int    // entries appended since the snapshot
	seq     uint64 // the last batch committed
	size    int64  // bytes of whole records in the journal
	// rewrite: the files are in the old format, or an append failed half
	// way: the next save writes a snapshot (and removes the journal).
	rewrite bool
	// droppedTail says what load cut off the journal (a torn last write).
	droppedTail string
}

// logEntry is one object in the snapshot or the journal; in the journal an
// entry without object records a deletion.
type logEntry struct {
	Key    string          `json:"key"`
	Source string          `json:"source,omitempty"`
	Object json.RawMessage `json:"object,omitempty"`
}

// batch is one journal record: the entries of one committed change.
type batch struct {
	Seq     uint64     `json:"seq"`
	Entries []logEntry `json:"entries"`
}

// Thresholds for rewriting the snapshot instead of appending.
const (
	bulkChange     = 256
	minJournalSize = 1024
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

const (
	recordHeaderLen = 19 // "B" + 8 hex + " " + 8 hex + " "
	snapshotMagic   = "# shunt objects v2 "
)

func (l *objectLog) snapshotPath() string { return filepath.Join(l.dir, "objects.json") }
func (l *objectLog) journalPath() string  { return filepath.Join(l.dir, "objects.journal") }

// damaged is the error for a file that is not what this code wrote.
func damaged(path string, off int64, what string) error {
	return fmt.Errorf("%s is damaged at byte offset %d: %s; the lab's objects cannot be loaded as they were committed. "+
		"Restore the file from a backup, or remove the lab with `shunt lab down` and create it again", path, off, what)
}

// frameRecord encodes one journal record.
func frameRecord(payload []byte) []byte {
	rec := make([]byte, 0, recordHeaderLen+len(payload)+1)
	rec = fmt.Appendf(rec, "B%08x %08x ", crc32.Checksum(payload, castagnoli), len(payload))
	rec = append(rec, payload...)
	return append(rec, '\n')
}

// parseRecord decodes the record at the start of data and returns its
// length, or why it is not a whole, intact record.
func parseRecord(data []byte) (batch, int, error) {
	var b batch
	if len(data) < recordHeaderLen {
		return b, 0, errors.New("incomplete record header")
	}
	h := data[:recordHeaderLen]
	if h[0] != 'B' || h[9] != ' ' || h[18] != ' ' {
		return b, 0, errors.New("not a record header")
	}
	sum, ok1 := parseHex8(h[1:9])
	n, ok2 := parseHex8(h[10:18])
	if !ok1 || !ok2 {
		return b, 0, errors.New("not a record header")
	}
	end := recordHeaderLen + int(n)
	if end >= len(data) {
		return b, 0, fmt.Errorf("record of %d bytes cut short", n)
	}
	payload := data[recordHeaderLen:end]
	if data[end] != '\n' {
		return b, 0, errors.New("record not terminated where its length says")
	}
	if crc32.Checksum(payload, castagnoli) != sum {
		return b, 0, errors.New("checksum mismatch")
	}
	if err := json.Unmarshal(payload, &b); err != nil {
		return b, 0, fmt.Errorf("record with a good checksum does not decode: %w", err)
	}
	return b, end + 1, nil
}

// parseHex8 reads 8 lowercase hex digits, exactly as frameRecord writes
// them, so that any change to a header byte is seen.
func parseHex8(h []byte) (uint32, bool) {
	var v uint32
	for _, c := range h {
		switch {
		case c >= '0' && c <= '9':
			v = v<<4 | uint32(c-'0')
		case c >= 'a' && c <= 'f':
			v = v<<4 | uint32(c-'a'+10)
		default:
			return 0, false
		}
	}
	return v, true
}

// goodRecordAfter returns the offset of an intact record that starts
// after the damaged one at off (at its declared end or after any newline),
// or -1. None means the damage is the torn tail of an unfinished write;
// one means acknowledged records follow the damage.
func goodRecordAfter(data []byte, off int) int {
	if h := data[off:]; len(h) >= recordHeaderLen && h[0] == 'B' {
		if n, ok := parseHex8(h[10:18]); ok {
			if p := off + recordHeaderLen + int(n) + 1; p < len(data) {
				if _, _, err := parseRecord(data[p:]); err == nil {
					return p
				}
			}
		}
	}
	for p := off; ; {
		i := bytes.IndexByte(data[p:], '\n')
		if i < 0 || p+i+1 >= len(data) {
			return -1
		}
		p += i + 1
		if _, _, err := parseRecord(data[p:]); err == nil {
			return p
		}
		if json.Valid(bytes.TrimSpace(lineAt(data, p))) && data[p] == '{' {
			return p // a whole line of the old format
		}
	}
}

func lineAt(data []byte, off int) []byte {
	if i := bytes.IndexByte(data[off:], '\n'); i >= 0 {
		return data[off : off+i]
	}
	return data[off:]
}

// load returns the persisted objects sorted by key. A torn last journal
// record is cut off the file (droppedTail says so); damage anywhere else
// is an error naming the file and the offset.
func (l *objectLog) load() ([]StoredObject, error) {
	*l = objectLog{dir: l.dir}
	objs := map[string]logEntry{}
	snapSeq, v2, err := l.loadSnapshot(objs)
	if err != nil {
		return nil, err
	}
	l.seq = snapSeq
	path := l.journalPath()
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	apply := func(e logEntry) {
		if e.Object == nil {
			delete(objs, e.Key)
		} else {
			objs[e.Key] = e
		}
		l.journal++
	}
	off := 0
	for off < len(data) {
		if data[off] == '{' {
			// A line of the old format: one object. Its changes are in a v2
			// snapshot if there is one (a v2 snapshot is only written after
			// the old journal was folded into it).
			line := lineAt(data, off)
			var e logEntry
			err := json.Unmarshal(line, &e)
			torn := off+len(line) == len(data) // no newline: an unfinished write
			if err != nil && !torn {
				return nil, damaged(path, int64(off), "a line of the old journal format does not decode: "+err.Error())
			}
			l.rewrite = true
			if err == nil && !v2 {
				apply(e)
			}
			off = min(off+len(line)+1, len(data))
			continue
		}
		b, n, err := parseRecord(data[off:])
		if err != nil {
			if good := goodRecordAfter(data, off); good >= 0 {
				return nil, fmt.Errorf("%s: the record at byte offset %d is damaged (%v), yet whole records follow it from byte offset %d: "+
					"this is not an unfinished write, and skipping it would load a part of the committed changes. "+
					"To start with the changes before it (the later ones are lost), cut the file there: `truncate -s %d %s`; "+
					"or remove the lab with `shunt lab down` and create it again", path, off, err, good, off, path)
			}
			// The last write never finished, so it was never acknowledged:
			// drop it, and cut it off so that the next append follows a
			// whole record.
			l.droppedTail = fmt.Sprintf("dropped an unfinished last record of %s (%d bytes from byte offset %d: %v)", path, len(data)-off, off, err)
			if err := truncateFile(path, int64(off)); err != nil {
				return nil, err
			}
			break
		}
		switch {
		case b.Seq <= snapSeq:
			// Already in the snapshot: the journal outlived it in a crash.
		case b.Seq != l.seq+1:
			// Batches are numbered without gaps from the snapshot on: a gap
			// means changes are missing (a snapshot removed or replaced).
			return nil, damaged(path, int64(off), fmt.Sprintf("batch %d follows batch %d (%s holds the batches up to %d): changes are missing", b.Seq, l.seq, l.snapshotPath(), snapSeq))
		default:
			for _, e := range b.Entries {
				apply(e)
			}
			l.seq = b.Seq
		}
		off += n
	}
	l.size = int64(off)
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

func truncateFile(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err == nil {
		err = f.Truncate(size)
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return fmt.Errorf("cutting the unfinished last record off %s: %w", path, err)
	}
	return nil
}

// loadSnapshot reads objects.json into objs and returns the last batch it
// holds (0 when there is none) and whether it is in the v2 format.
func (l *objectLog) loadSnapshot(objs map[string]logEntry) (uint64, bool, error) {
	path := l.snapshotPath()
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("reading %s: %w", path, err)
	}
	var seq uint64
	body, start, v2 := data, 0, bytes.HasPrefix(data, []byte(snapshotMagic))
	if v2 {
		nl := bytes.IndexByte(data, '\n')
		if nl < 0 {
			return 0, false, damaged(path, 0, "the header line is not terminated")
		}
		var n int
		var sum uint32
		header := string(data[:nl])
		if _, err := fmt.Sscanf(header, snapshotMagic+"seq=%d len=%d crc32c=%x", &seq, &n, &sum); err != nil ||
			fmt.Sprintf(snapshotMagic+"seq=%d len=%d crc32c=%08x", seq, n, sum) != header {
			return 0, false, damaged(path, 0, fmt.Sprintf("bad header line %q", header))
		}
		body, start = data[nl+1:], nl+1
		if len(body) != n {
			return 0, false, damaged(path, int64(start+min(n, len(body))), fmt.Sprintf("the header says %d bytes of objects follow it, the file holds %d", n, len(body)))
		}
		if crc32.Checksum(body, castagnoli) != sum {
			return 0, false, damaged(path, int64(start), fmt.Sprintf("checksum mismatch over the %d bytes of objects", n))
		}
	} else {
		l.rewrite = true // the old format: a bare JSON array
	}
	var snap []logEntry
	if err := json.Unmarshal(body, &snap); err != nil {
		off := int64(start)
		var se *json.SyntaxError
		if errors.As(err, &se) {
			off += se.Offset
		}
		return 0, false, damaged(path, off, err.Error())
	}
	for _, e := range snap {
		objs[e.Key] = e
	}
	return seq, v2, nil
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

// save records the changed keys of store as one batch: when it returns
// nil, the whole change is on disk, fsync'd; after a crash at any moment
// before, none of it is.
func (l *objectLog) save(store *model.Store, changed []manifest.Key) error {
	if len(changed) == 0 {
		return nil
	}
	if l.rewrite || len(changed) > bulkChange || l.journal+len(changed) > max(minJournalSize, store.Len()/4) {
		return l.snapshot(store)
	}
	b := batch{Seq: l.seq + 1, Entries: make([]logEntry, len(changed))}
	for i, key := range changed {
		e, err := entryFor(store, key)
		if err != nil {
			return err
		}
		b.Entries[i] = e
	}
	payload, err := json.Marshal(b)
	if err != nil {
		return err
	}
	rec := frameRecord(payload)
	path := l.journalPath()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("appending to %s: %w", path, err)
	}
	_, err = f.Write(rec)
	if err == nil {
		err = f.Sync()
	}
	if err != nil {
		// Take back a partial write (ENOSPC) so that the next record does
		// not follow a torn one; failing that, the next save rewrites the
		// snapshot and removes the journal.
		if f.Truncate(l.size) != nil {
			l.rewrite = true
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && l.size == 0 {
		err = atomicfile.SyncDir(l.dir) // the journal file was just created
	}
	if err != nil {
		return fmt.Errorf("appending to %s: %w", path, err)
	}
	l.size += int64(len(rec))
	l.seq = b.Seq
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

// snapshot rewrites every object as batch seq+1 and empties the journal.
// Objects are encoded on every CPU: 20 000 of them take a quarter of a
// second on one.
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
	body := make([]byte, 0, size)
	body = append(body, '[')
	for i, line := range lines {
		if i > 0 {
			body = append(body, ",\n"...)
		}
		body = append(body, line...)
	}
	body = append(body, "]\n"...)
	seq := l.seq + 1
	header := fmt.Sprintf(snapshotMagic+"seq=%d len=%d crc32c=%08x\n", seq, len(body), crc32.Checksum(body, castagnoli))
	data := make([]byte, 0, len(header)+len(body))
	data = append(append(data, header...), body...)
	if err := atomicfile.Write(l.snapshotPath(), data); err != nil {
		return err
	}
	l.seq = seq
	// Only now that the snapshot is durable may the journal go. Should
	// the removal be lost in a crash, its records are all at or below seq
	// and load skips them.
	if err := os.Remove(l.journalPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
		l.rewrite = true
		return fmt.Errorf("removing %s after writing %s: %w", l.journalPath(), l.snapshotPath(), err)
	}
	l.journal, l.size, l.rewrite = 0, 0, false
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
