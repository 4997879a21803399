package clicheck

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

func TestPlaceholders(t *testing.T) {
	root := &cobra.Command{Use: "root"}
	sub := &cobra.Command{Use: "sub", Run: func(*cobra.Command, []string) {}}
	root.AddCommand(sub)
	var s string
	var b bool
	root.PersistentFlags().StringVar(&s, "good", "", "a `FILE` to read")
	root.PersistentFlags().StringVar(&s, "plain", "", "read by 'shunt observe'")
	sub.Flags().StringVar(&s, "history", "", "flows kept for `shunt observe`")
	sub.Flags().BoolVar(&b, "accel", false, "see `shunt accel`")
	sub.Flags().BoolVar(&b, "quiet", false, "say less")

	got := Placeholders(root)
	if len(got) != 2 {
		t.Fatalf("want 2 problems, got %d: %q", len(got), got)
	}
	if !strings.Contains(got[0], "root sub --accel") || !strings.Contains(got[1], "root sub --history") {
		t.Errorf("problems: %q", got)
	}
}
