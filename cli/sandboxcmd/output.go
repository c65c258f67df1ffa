package sandboxcmd

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/agentenv/agentenv/cli/client"
	"github.com/spf13/cobra"
)

// output is the --output flag shared by every printing command.
type output struct{ format string }

func (o *output) register(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&o.format, "output", "o", "table", "output format: table or json")
}

func (o *output) validate() error {
	if o.format != "table" && o.format != "json" {
		return fmt.Errorf("--output %q: use table or json", o.format)
	}
	return nil
}

func (o *output) json() bool { return o.format == "json" }

// printJSON writes v as indented JSON.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printList prints items as JSON, or as a table with one row per item.
func printList[T any](w io.Writer, o *output, items []T, header []string, row func(T) []string) error {
	if o.json() {
		return printJSON(w, items)
	}
	rows := make([][]string, 0, len(items))
	for _, it := range items {
		rows = append(rows, row(it))
	}
	return table(w, header, rows)
}

// table writes a header and rows aligned in columns.
func table(w io.Writer, header []string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

func kv(m map[string]string) string {
	if len(m) == 0 {
		return "-"
	}
	parts := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, ",")
}

func when(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Local().Format("2006-01-02 15:04:05")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// withClient is the prologue of every command that talks to aenvd: its
// --output flag checked (o is nil for a command without one) and a client
// made from the saved configuration, then run.
func withClient(o *output, run func(cmd *cobra.Command, args []string, c *client.Client) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		if o != nil {
			if err := o.validate(); err != nil {
				return err
			}
		}
		c, err := newClient()
		if err != nil {
			return err
		}
		return run(cmd, args, c)
	}
}
