// Package clicheck checks the flags of shunt's commands the way `--help`
// shows them, for the commands' tests: pflag takes the first back-quoted
// word of a usage string as the flag's value placeholder
// (pflag.UnquoteUsage), so "(see `shunt observe`)" in a usage line makes
// `--help` print "--flow-history shunt observe".
package clicheck

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Placeholders walks root and every command under it and returns one line
// per flag whose `--help` placeholder is wrong: one with a space (a
// back-quoted phrase, not a value's name), or any on a boolean flag (which
// takes no value).
func Placeholders(root *cobra.Command) []string {
	var bad []string
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			if p := check(f); p != "" {
				bad = append(bad, fmt.Sprintf("%s --%s: %s", c.CommandPath(), f.Name, p))
			}
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	return bad
}

func check(f *pflag.Flag) string {
	name, _ := pflag.UnquoteUsage(f)
	switch {
	case f.Value.Type() == "bool" && name != "":
		return fmt.Sprintf("boolean flag shows the placeholder %q (a back-quoted word in its usage)", name)
	case strings.ContainsAny(name, " \t"):
		return fmt.Sprintf("placeholder %q has a space (pflag takes the first back-quoted phrase of the usage): use quotes or plain words", name)
	}
	return ""
}
