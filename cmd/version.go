package cmd

import (
	"fmt"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// Version is set at build time with -ldflags "-X github.com/kiln-ml/kiln/cmd.Version=...".
var Version = "dev"

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "version",
		Short:   "Print kiln's version",
		Example: "  kiln version",
		Args:    argsUsage(cobra.NoArgs),
		RunE: func(c *cobra.Command, _ []string) error {
			v := Version
			if bi, ok := debug.ReadBuildInfo(); ok && v == "dev" {
				for _, s := range bi.Settings {
					if s.Key == "vcs.revision" && len(s.Value) >= 12 {
						v = "dev+" + s.Value[:12]
					}
				}
			}
			fmt.Fprintf(c.OutOrStdout(), "kiln %s\n", v)
			return nil
		},
	}
}
