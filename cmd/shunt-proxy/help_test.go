package main

import (
	"testing"

	"github.com/shuntnet/shunt/internal/clicheck"
)

// TestFlagPlaceholders: see cmd/shunt's.
func TestFlagPlaceholders(t *testing.T) {
	for _, p := range clicheck.Placeholders(newRootCmd()) {
		t.Error(p)
	}
}
