// Package atomicfile writes state files so that a crash leaves either the
// old or the new content, never a mix.
package atomicfile

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// Write replaces path with data through a temporary file and a rename. The
// temporary file is fsync'd before the rename (or a crash could leave the
// new name pointing at an empty or partly written file, as on ext4 with
// delalloc) and the directory after it (or the rename itself could be
// lost), so when Write returns the new content is durable. The file is
// private to its owner (0600).
func Write(path string, data []byte) error {
	return WriteMode(path, data, 0o600)
}

// WriteMode is Write with the file's permissions, which the file has
// before it takes path's name (an executable replaced this way is never
// seen without its x bits).
func WriteMode(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	// OpenFile's mode is only for a new file, and the umask trims it.
	err = f.Chmod(mode)
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := SyncDir(filepath.Dir(path)); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// SyncDir makes the creations, renames and removals of entries in dir
// durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("syncing directory %s: %w", dir, err)
	}
	return nil
}

// WriteJSON writes v as JSON unless the file holds that already (last is
// what it was last written or read with); it returns what the file holds.
func WriteJSON(path string, v any, last []byte) ([]byte, error) {
	data, err := json.Marshal(v)
	if err != nil || bytes.Equal(data, last) {
		return last, err
	}
	if err := Write(path, data); err != nil {
		return last, err
	}
	return data, nil
}
