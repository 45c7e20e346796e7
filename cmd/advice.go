package cmd

import (
	"github.com/spf13/cobra"
)

// advisors map typed library errors to advice for the user. Each command file
// may add entries in an init function; libraries never print advice themselves.
var advisors []func(error) string

func advice(err error) string {
	for _, a := range advisors {
		if s := a(err); s != "" {
			return s
		}
	}
	return ""
}

// argsUsage wraps a cobra argument validator so that its errors exit with ExitUsage.
func argsUsage(v cobra.PositionalArgs) cobra.PositionalArgs {
	return func(c *cobra.Command, args []string) error {
		if err := v(c, args); err != nil {
			return usageErr(err)
		}
		return nil
	}
}
