// Package sandboxcmd implements the aenv CLI's commands that drive an aenvd
// node: auth, start, exec, connect, upload, download, pause, resume, fork,
// list, rm, timeout, pin, compose, snapshot, template and nodes.
package sandboxcmd

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/agentenv/agentenv/api/wire"
	"github.com/agentenv/agentenv/cli/client"
	"github.com/agentenv/agentenv/cli/clientcfg"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

// ExitError carries a remote command's exit code out of a command; main
// exits with Code and prints nothing.
type ExitError struct{ Code int }

func (e *ExitError) Error() string { return fmt.Sprintf("exit status %d", e.Code) }

// Commands returns the node commands to add to the root command.
func Commands() []*cobra.Command {
	return []*cobra.Command{
		authCmd(), startCmd(), execCmd(), connectCmd(), uploadCmd(), downloadCmd(),
		pauseCmd(), resumeCmd(), forkCmd(), listCmd(), rmCmd(), timeoutCmd(), pinCmd(), resizeCmd(), composeCmd(),
		snapshotCmd(), templateCmd(), nodesCmd(), nodeCmd(), webhookCmd(), volumeCmd(),
	}
}

// newClient builds a client from the stored config and the environment.
func newClient() (*client.Client, error) {
	cfg, err := clientcfg.Load()
	if err != nil {
		return nil, err
	}
	if err := clientcfg.ValidateURL(cfg.URL); err != nil {
		return nil, fmt.Errorf("%w (fix it with `aenv auth` or AENV_URL)", err)
	}
	if cfg.APIKey == "" {
		return nil, errors.New("no API key configured: run `aenv auth --url URL < KEYFILE` (or type the key at its prompt) or set AENV_API_KEY")
	}
	return client.New(cfg.URL, cfg.APIKey), nil
}

// seconds parses a timeout given as seconds ("300") or a Go duration ("5m").
func seconds(s string) (int32, error) {
	if s == "" {
		return 0, nil
	}
	if n, err := strconv.Atoi(s); err == nil {
		if n < 0 {
			return 0, fmt.Errorf("timeout %q is negative", s)
		}
		return int32(n), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("timeout %q: give seconds (300) or a duration (5m, 1h)", s)
	}
	return int32(d.Round(time.Second) / time.Second), nil
}

// pairs parses repeated KEY=VALUE flags.
func pairs(flag string, vals []string) (map[string]string, error) {
	if len(vals) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(vals))
	for _, v := range vals {
		k, val, ok := strings.Cut(v, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--%s %q: want KEY=VALUE", flag, v)
		}
		m[k] = val
	}
	return m, nil
}

// running returns a handle on a running sandbox's agent, with a clear
// error for unknown or paused ones.
func running(ctx context.Context, c *client.Client, id, user string) (*client.Sandbox, error) {
	d, err := c.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if d.State != wire.Running {
		return nil, fmt.Errorf("sandbox %s is %s: run `aenv resume %s` first (or `aenv connect %s`)", id, d.State, id, id)
	}
	token := ""
	if d.EnvdAccessToken != nil {
		token = *d.EnvdAccessToken
	}
	return c.Sandbox(id, token, user), nil
}

func authCmd() *cobra.Command {
	var url, key string
	var noVerify bool
	cmd := &cobra.Command{
		Use:   "auth",
		Short: "Store the aenvd URL and API key (in ~/.config/aenv, mode 0600)",
		Long: "Store the aenvd URL and API key in ~/.config/aenv/config.json (mode 0600).\n" +
			"AENV_URL and AENV_API_KEY override the stored values. The key is read from stdin (aenv auth < /var/lib/aenv/api-key)\n" +
			"or a prompt on the terminal; --api-key works too but is discouraged: every local user sees it in ps.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cur, _ := clientcfg.Load()
			if url == "" {
				url = cur.URL
			}
			if key != "" {
				fmt.Fprintln(cmd.ErrOrStderr(), "warning: a key given with --api-key is visible to every local user (ps, /proc); pipe it on stdin instead")
			} else {
				var err error
				if key, err = readKey(cmd); err != nil {
					return err
				}
			}
			if !noVerify {
				c := client.New(url, key)
				if _, err := c.Nodes(cmd.Context()); err != nil {
					return fmt.Errorf("verify the credentials: %w (use --no-verify to store them anyway)", err)
				}
			}
			p, err := clientcfg.Save(clientcfg.Config{URL: url, APIKey: key})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Saved %s for %s\n", p, strings.TrimRight(url, "/"))
			return nil
		},
	}
	cmd.Flags().StringVar(&url, "url", "", "aenvd API URL (default: the stored one, else "+clientcfg.DefaultURL+")")
	cmd.Flags().StringVar(&key, "api-key", "", "API key in argv: discouraged, visible to every local user in ps (default: read it from stdin or a prompt)")
	cmd.Flags().BoolVar(&noVerify, "no-verify", false, "store without checking the key against the server")
	return cmd
}

func readKey(cmd *cobra.Command) (string, error) {
	if f, ok := cmd.InOrStdin().(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		fmt.Fprint(cmd.ErrOrStderr(), "API key: ")
		b, err := term.ReadPassword(int(f.Fd()))
		fmt.Fprintln(cmd.ErrOrStderr())
		if err != nil {
			return "", fmt.Errorf("read the API key from the terminal: %w", err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	line, err := bufio.NewReader(cmd.InOrStdin()).ReadString('\n')
	if strings.TrimSpace(line) == "" {
		return "", fmt.Errorf("no API key given: pipe it on stdin (aenv auth < /var/lib/aenv/api-key) or type it at the prompt (%v)", err)
	}
	return strings.TrimSpace(line), nil
}

func printSandbox(cmd *cobra.Command, o *output, s wire.Sandbox) error {
	if o.json() {
		return printJSON(cmd.OutOrStdout(), s)
	}
	return table(cmd.OutOrStdout(), []string{"SANDBOX ID", "TEMPLATE", "ENVD"}, [][]string{{s.SandboxID, s.TemplateID, s.EnvdVersion}})
}

// startFlags are `aenv start`'s flags.
type startFlags struct {
	detach, rm, secure bool
	timeout, user      string
	envs, md, vols     []string
	o                  output
}

func startCmd() *cobra.Command {
	var f startFlags
	cmd := &cobra.Command{
		Use:   "start TEMPLATE",
		Short: "Create a sandbox and attach a terminal to it",
		Long: "Create a sandbox from TEMPLATE and open an interactive shell in it; exiting the shell returns its exit code.\n" +
			"With -d the sandbox is created, printed and left running until its timeout.",
		Example: "  aenv start base\n  aenv start base -d --timeout 10m --metadata owner=me -o json",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := f.o.validate(); err != nil {
				return err
			}
			req, err := f.request(args[0])
			if err != nil {
				return err
			}
			c, err := newClient()
			if err != nil {
				return err
			}
			s, err := c.Create(cmd.Context(), req)
			if err != nil {
				return err
			}
			if f.detach {
				return printSandbox(cmd, &f.o, s)
			}
			return f.attach(cmd, c, s)
		},
	}
	cmd.Flags().BoolVarP(&f.detach, "detach", "d", false, "do not attach a terminal; print the sandbox")
	cmd.Flags().BoolVar(&f.rm, "rm", false, "remove the sandbox when the terminal exits")
	cmd.Flags().BoolVar(&f.secure, "secure", true, "require the sandbox's access token for every agent request (aenv sends it); --secure=false lets anyone who knows the sandbox's id reach its agent through the proxy")
	cmd.Flags().StringVar(&f.timeout, "timeout", "5m", "lifetime in seconds or as a duration (an attached terminal keeps it alive)")
	cmd.Flags().StringArrayVarP(&f.envs, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	cmd.Flags().StringArrayVar(&f.md, "metadata", nil, "metadata KEY=VALUE (repeatable)")
	cmd.Flags().StringArrayVar(&f.vols, "volume", nil, "mount a volume: NAME:PATH, or NAME:PATH:ro read-only (repeatable)")
	cmd.Flags().StringVarP(&f.user, "user", "u", "", "user of the shell (default: the template's)")
	f.o.register(cmd)
	return cmd
}

// request is the create request the flags describe (unset fields are the
// server's defaults).
func (f *startFlags) request(template string) (wire.NewSandbox, error) {
	req := wire.NewSandbox{TemplateID: template}
	secs, err := seconds(f.timeout)
	if err != nil {
		return req, err
	}
	env, err := pairs("env", f.envs)
	if err != nil {
		return req, err
	}
	meta, err := pairs("metadata", f.md)
	if err != nil {
		return req, err
	}
	mounts, err := volumeMounts(f.vols)
	if err != nil {
		return req, err
	}
	req.Secure = &f.secure // sent either way: the API's own default differs by version
	if secs > 0 {
		req.Timeout = &secs
	}
	if env != nil {
		req.EnvVars = &env
	}
	if meta != nil {
		req.Metadata = &meta
	}
	if mounts != nil {
		req.VolumeMounts = &mounts
	}
	return req, nil
}

// attach opens a shell in the new sandbox, keeping it alive while attached,
// and removes it afterwards with --rm; the shell's exit code is the
// command's.
func (f *startFlags) attach(cmd *cobra.Command, c *client.Client, s wire.Sandbox) error {
	token := ""
	if s.EnvdAccessToken != nil {
		token = *s.EnvdAccessToken
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "Sandbox %s started from %s.\n", s.SandboxID, s.TemplateID)
	stop := keepAlive(cmd.Context(), c, s.SandboxID)
	code, err := attach(cmd, c.Sandbox(s.SandboxID, token, f.user), nil)
	stop()
	if f.rm {
		if kerr := c.Kill(context.WithoutCancel(cmd.Context()), s.SandboxID); kerr != nil && err == nil {
			err = kerr
		}
	} else {
		fmt.Fprintf(cmd.ErrOrStderr(), "Sandbox %s keeps running until its timeout: `aenv connect %s` to return, `aenv rm %s` to remove it.\n", s.SandboxID, s.SandboxID, s.SandboxID)
	}
	if err != nil {
		return err
	}
	if code != 0 {
		return &ExitError{Code: code}
	}
	return nil
}

func connectCmd() *cobra.Command {
	var timeout, user string
	cmd := &cobra.Command{
		Use:   "connect SANDBOX_ID [-- CMD...]",
		Short: "Open a terminal in a sandbox (resuming it if paused)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			secs, err := seconds(timeout)
			if err != nil {
				return err
			}
			c, err := newClient()
			if err != nil {
				return err
			}
			sb, err := resumeIfPaused(cmd, c, args[0], secs, user)
			if err != nil {
				return err
			}
			stop := keepAlive(cmd.Context(), c, args[0])
			code, err := attach(cmd, sb, args[1:])
			stop()
			if err != nil {
				return err
			}
			if code != 0 {
				return &ExitError{Code: code}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&timeout, "timeout", "", "extend the sandbox's lifetime to this (seconds or duration)")
	cmd.Flags().StringVarP(&user, "user", "u", "", "user of the shell (default: the template's)")
	return cmd
}

// keepAlive extends the sandbox's lifetime while a terminal or command is
// attached (refreshes only ever extend), so that a session does not end
// under the user's hands. stop ends it.
func keepAlive(ctx context.Context, c *client.Client, id string) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		for {
			if err := c.Refresh(ctx, id, keepAliveSecs); err != nil && ctx.Err() == nil && client.NotFound(err) {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(keepAliveSecs * time.Second / 3):
			}
		}
	}()
	return cancel
}

// keepAliveSecs is how long an attached session keeps its sandbox alive
// past the last refresh.
const keepAliveSecs = 60

// resumeIfPaused returns a handle on sandbox id's agent, resuming it if it
// is paused. The server's connect call sets the lifetime (to its default
// when secs is 0), so a running sandbox is only connected to when the user
// asked for a new timeout.
func resumeIfPaused(cmd *cobra.Command, c *client.Client, id string, secs int32, user string) (*client.Sandbox, error) {
	if secs == 0 {
		d, err := c.Get(cmd.Context(), id)
		if err != nil {
			return nil, err
		}
		if d.State == wire.Running {
			token := ""
			if d.EnvdAccessToken != nil {
				token = *d.EnvdAccessToken
			}
			return c.Sandbox(id, token, user), nil
		}
	}
	s, resumed, err := c.Connect(cmd.Context(), id, secs, true)
	if err != nil {
		return nil, err
	}
	if resumed {
		fmt.Fprintf(cmd.ErrOrStderr(), "Resumed sandbox %s.\n", s.SandboxID)
	}
	token := ""
	if s.EnvdAccessToken != nil {
		token = *s.EnvdAccessToken
	}
	return c.Sandbox(s.SandboxID, token, user), nil
}

func execCmd() *cobra.Command {
	var user, cwd string
	var envs []string
	var stdin bool
	cmd := &cobra.Command{
		Use:   "exec SANDBOX_ID -- CMD [ARG...]",
		Short: "Run a command in a sandbox, streaming its output; exits with its exit code",
		Long: "Run CMD with its arguments as given (no shell parsing; PATH from a login shell) and stream its\n" +
			"stdout and stderr. aenv exits with the command's exit code. Use `sh -c '...'` for shell syntax.",
		Example: "  aenv exec SANDBOX_ID -- ls -la /\n  echo hi | aenv exec -i SANDBOX_ID -- cat",
		Args:    cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			env, err := pairs("env", envs)
			if err != nil {
				return err
			}
			c, err := newClient()
			if err != nil {
				return err
			}
			sb, err := running(cmd.Context(), c, args[0], user)
			if err != nil {
				return err
			}
			var in = cmd.InOrStdin()
			if !stdin {
				in = nil
			}
			stop := keepAlive(cmd.Context(), c, args[0])
			defer stop()
			code, err := sb.Exec(cmd.Context(), client.Command{Argv: args[1:], Env: env, Cwd: cwd}, in, cmd.OutOrStdout(), cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if code != 0 {
				return &ExitError{Code: code}
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&user, "user", "u", "", "run as this user (default: the template's)")
	cmd.Flags().StringVarP(&cwd, "cwd", "w", "", "working directory")
	cmd.Flags().StringArrayVarP(&envs, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	cmd.Flags().BoolVarP(&stdin, "interactive", "i", false, "copy stdin to the command")
	return cmd
}

func listCmd() *cobra.Command {
	var states, md []string
	var o output
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List sandboxes (all pages)",
		Example: "  aenv list --state running --metadata owner=me -o json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.validate(); err != nil {
				return err
			}
			var st []string
			for _, s := range states {
				for _, p := range strings.Split(s, ",") {
					if p != "running" && p != "paused" {
						return fmt.Errorf("--state %q: use running or paused", p)
					}
					st = append(st, p)
				}
			}
			meta, err := pairs("metadata", md)
			if err != nil {
				return err
			}
			c, err := newClient()
			if err != nil {
				return err
			}
			list, err := c.List(cmd.Context(), client.ListOptions{States: st, Metadata: meta})
			if err != nil {
				return err
			}
			header := []string{"SANDBOX ID", "TEMPLATE", "STATE", "STARTED", "ENDS", "CPU", "MEM MB", "METADATA"}
			return printList(cmd.OutOrStdout(), &o, list, header, func(s wire.ListedSandbox) []string {
				var m map[string]string
				if s.Metadata != nil {
					m = *s.Metadata
				}
				return []string{s.SandboxID, s.TemplateID, string(s.State), when(s.StartedAt), when(s.EndAt),
					strconv.Itoa(int(s.CpuCount)), strconv.Itoa(int(s.MemoryMB)), kv(m)}
			})
		},
	}
	cmd.Flags().StringSliceVar(&states, "state", nil, "only these states: running, paused (comma-separated or repeated)")
	cmd.Flags().StringArrayVar(&md, "metadata", nil, "only sandboxes with metadata KEY=VALUE (repeatable; all must match)")
	o.register(cmd)
	return cmd
}

func forkCmd() *cobra.Command {
	var count int
	var timeout string
	var o output
	cmd := &cobra.Command{
		Use:   "fork SANDBOX_ID",
		Short: "Clone a running sandbox into N new ones",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.validate(); err != nil {
				return err
			}
			if count < 1 || count > 100 {
				return fmt.Errorf("--count %d: use 1 to 100", count)
			}
			secs, err := seconds(timeout)
			if err != nil {
				return err
			}
			c, err := newClient()
			if err != nil {
				return err
			}
			res, err := c.Fork(cmd.Context(), args[0], count, secs)
			if errors.Is(err, client.ErrUnsupported) {
				return fmt.Errorf("%w: this aenvd cannot fork sandboxes yet", err)
			}
			if err != nil {
				return err
			}
			failed := 0
			rows := [][]string{}
			for _, r := range res {
				switch {
				case r.Sandbox != nil:
					rows = append(rows, []string{r.Sandbox.SandboxID, r.Sandbox.TemplateID, "-"})
				case r.Error != nil:
					failed++
					rows = append(rows, []string{"-", "-", r.Error.Message})
				}
			}
			if o.json() {
				err = printJSON(cmd.OutOrStdout(), res)
			} else {
				err = table(cmd.OutOrStdout(), []string{"SANDBOX ID", "TEMPLATE", "ERROR"}, rows)
			}
			if err == nil && failed > 0 {
				err = fmt.Errorf("fork sandbox %s: %d of %d children failed (see above)", args[0], failed, len(res))
			}
			return err
		},
	}
	cmd.Flags().IntVarP(&count, "count", "n", 1, "number of children (1..100)")
	cmd.Flags().StringVar(&timeout, "timeout", "", "lifetime of the children (seconds or duration)")
	o.register(cmd)
	return cmd
}
