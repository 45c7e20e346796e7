package cmd

import (
	"encoding/json"
	"fmt"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// Version is set at build time with -ldflags "-X github.com/kiln-ml/kiln/cmd.Version=...".
var Version = "dev"

// version is kiln's version: Version, or for a development build the
// commit it was built from.
func version() string {
	v := Version
	if bi, ok := debug.ReadBuildInfo(); ok && v == "dev" {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				v = "dev+" + s.Value[:12]
			}
		}
	}
	return v
}

func newVersionCmd() *cobra.Command {
	var format string
	c := &cobra.Command{
		Use:     "version",
		Short:   "Print kiln's version",
		Example: "  kiln version\n  kiln version --format json",
		Args:    argsUsage(cobra.NoArgs),
		RunE: func(c *cobra.Command, _ []string) error {
			if format == formatJSON {
				return json.NewEncoder(c.OutOrStdout()).Encode(struct {
					Version string `json:"version"`
				}{version()})
			}
			_, err := fmt.Fprintf(c.OutOrStdout(), "kiln %s\n", version())
			return err
		},
	}
	formatFlag(c.Flags(), &format)
	return c
}
