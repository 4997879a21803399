// Package atomicfile writes state files so that a crash leaves either the
// old or the new content, never a mix.
package atomicfile

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
)

// Write replaces path with data through a temporary file and a rename.
func Write(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return os.Rename(tmp, path)
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
