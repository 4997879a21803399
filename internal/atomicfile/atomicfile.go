// Package atomicfile writes state files so that a crash leaves either the
// old or the new content, never a mix.
package atomicfile

import (
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
