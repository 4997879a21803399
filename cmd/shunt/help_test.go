package main

import (
	"testing"

	"github.com/shuntnet/shunt/internal/clicheck"
)

// TestFlagPlaceholders: `--help` shows every flag with a value name, not a
// back-quoted phrase of its usage, and none on a boolean flag.
func TestFlagPlaceholders(t *testing.T) {
	for _, p := range clicheck.Placeholders(newRootCmd()) {
		t.Error(p)
	}
}
