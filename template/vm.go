package template

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/snapshot"
	storimage "github.com/agentenv/agentenv/storage/image"

	"connectrpc.com/connect"

	"github.com/agentenv/agentenv/guest/agent/agentclient"
	pb "github.com/agentenv/agentenv/guest/agent/gen/process"
	"github.com/agentenv/agentenv/network"
	"github.com/agentenv/agentenv/oci"
	"github.com/agentenv/agentenv/vmm"
)

const agentURL = "http://agent"

// buildVM is the state of a running build: its VM, the agent and the
// USER/WORKDIR/ENV/ARG the steps so far set.
type buildVM struct {
	b        *Builder
	tid, bid string
	slot     *network.Slot
	hc       *http.Client
	user     string
	workdir  string
	env      map[string]string // ENV: persisted in the template
	args     map[string]string // ARG: build only
	bash     string            // shell RUN uses
}

func (v *buildVM) logf(level, step, format string, a ...any) {
	v.b.buildLog(v.tid, v.bid, level, step, fmt.Sprintf(format, a...))
}

// execute runs one build to a committed snapshot. It returns the built
// template (snapshot, disk, defaults) or the error and the step it failed in.
func (b *Builder) execute(ctx context.Context, t *Template, buildID string, spec BuildSpec) (built *Template, step string, err error) {
	dir := b.buildDir(t.ID, buildID)
	if err := clearBuildDir(dir); err != nil {
		return nil, StepBase, err
	}
	built = &Template{ID: t.ID, Dir: dir, Snapshot: filepath.Join(dir, "snapshot"), VCPUs: t.VCPUs, MemoryMiB: t.MemoryMiB,
		EnvdVersion: AgentVersion}
	v := &buildVM{b: b, tid: t.ID, bid: buildID, env: map[string]string{}, args: map[string]string{}, bash: "/bin/bash"}
	vs, disk, err := b.vmSpec(ctx, v, t, spec, built)
	if err != nil {
		return nil, StepBase, err
	}
	vm, err := sandbox.Start(ctx, b.cfg.VMs, vs)
	if err != nil {
		return nil, StepBase, fmt.Errorf("start build VM: %w", err)
	}
	defer vm.Close(context.WithoutCancel(ctx))
	v.slot, v.hc = vm.Slot, sandbox.AgentClient(vm.Slot, 0)
	v.logf("info", StepBase, "build VM is up; user %s, workdir %s", v.user, v.workdir)

	for i, st := range spec.Steps {
		step = strconv.Itoa(i + 1)
		if err := v.step(ctx, step, st); err != nil {
			return nil, step, err
		}
	}
	step = StepFinalize
	if err := v.startAndWait(ctx, spec); err != nil {
		return nil, step, err
	}
	if err := v.commit(ctx, vm, disk, built); err != nil {
		return nil, step, err
	}
	return built, step, nil
}

// vmSpec prepares the build VM: its root disk (a converted image, or the
// source template's disk) and a cold boot or a restore of the source.
func (b *Builder) vmSpec(ctx context.Context, v *buildVM, t *Template, spec BuildSpec, built *Template) (sandbox.Spec, Disk, error) {
	dir, buildID := built.Dir, v.bid
	var src *Template
	var imageCfg string
	if spec.FromImage != "" || spec.FromRootfs != "" {
		var layer string
		var err error
		if spec.FromImage != "" {
			layer, err = b.baseImage(ctx, v, spec.FromImage, built)
		} else {
			layer, err = b.variantLayer(ctx, v, spec.FromRootfs, built)
		}
		if err != nil {
			return sandbox.Spec{}, nil, err
		}
		imageCfg = filepath.Join(dir, "rootfs-boot.json")
		if err := snapshot.WriteImageConfig(imageCfg, []string{layer}); err != nil {
			return sandbox.Spec{}, nil, err
		}
	} else {
		var err error
		if src, err = b.source(spec.FromTemplate); err != nil {
			return sandbox.Spec{}, nil, err
		}
		if len(src.Drives) > 0 {
			return sandbox.Spec{}, nil, fmt.Errorf("fromTemplate %s: it carries extra drives, which a template cannot keep", src.ID)
		}
		built.Parent, built.DiskMiB, built.VCPUs, built.MemoryMiB = src.ID, src.DiskMiB, src.VCPUs, src.MemoryMiB
		built.DriveSlots = src.DriveSlots
		if src.VCPUs != t.VCPUs || src.MemoryMiB != t.MemoryMiB {
			v.logf("warn", StepBase, "a build from template %s keeps its %d vCPUs and %d MiB (a snapshot's resources are fixed)", src.ID, src.VCPUs, src.MemoryMiB)
		}
		imageCfg = src.RootfsImage
		v.env = maps.Clone(src.Env)
		if v.env == nil {
			v.env = map[string]string{}
		}
		v.user, v.workdir = src.DefaultUser, src.DefaultWorkdir
	}
	if v.user == "" {
		v.user = b.cfg.DefaultUser
	}
	if v.workdir == "" {
		v.workdir = homeOf(v.user)
	}
	disk := b.host.BuildDisk("build-"+buildID, dir, imageCfg)
	vs := sandbox.Spec{ID: "build-" + buildID, RunDir: filepath.Join(dir, "run"), Disk: disk,
		VCPUs: built.VCPUs, MemoryMiB: built.MemoryMiB, AgentWait: 5 * time.Minute, Init: &sandbox.InitRequest{},
		Started: func(m vmm.Machine) error { b.setPID(t.ID, buildID, m.Info().PID); return nil }}
	vs.Drives = make([]sandbox.Disk, built.DriveSlots) // empty slots, the source's (a restore) or new ones
	if src != nil {
		v.logf("info", StepBase, "restoring template %s", src.ID)
		vs.Restore = src.Snapshot
		vs.Memory = func(ctx context.Context) (sandbox.Memory, error) {
			file, err := b.host.RestoreMemory(ctx, src.Snapshot)
			return sandbox.Memory{File: file}, err
		}
		return vs, disk, nil
	}
	kernel, initrd, err := CopyBootFiles(ctx, dir, b.cfg.Image.Assets.Kernel, b.cfg.Image.Assets.Initrd)
	if err != nil {
		return sandbox.Spec{}, nil, err
	}
	built.DriveSlots = sandbox.DriveSlots(b.cfg.VMs.Driver)
	vs.Drives = make([]sandbox.Disk, built.DriveSlots)
	v.logf("info", StepBase, "booting the build VM (%d vCPU, %d MiB)", built.VCPUs, built.MemoryMiB)
	vs.Boot = &vmm.Config{Kernel: kernel, Initrd: initrd, VCPUs: built.VCPUs, MemoryMiB: built.MemoryMiB,
		Cmdline: "root=/dev/vda rw quiet"}
	return vs, disk, nil
}

// source resolves a fromTemplate to a ready template.
func (b *Builder) source(idOrName string) (*Template, error) {
	if st, ok := b.Resolve(idOrName); ok && st.Ready() && st.Snapshot != "" {
		return &st, nil
	}
	if st, err := b.host.Committed(idOrName); err == nil {
		return st, nil
	}
	return nil, fmt.Errorf("fromTemplate %q: no ready template by that id or name", idOrName)
}

// commit makes the final USER, WORKDIR and ENV the agent's defaults (kept
// in the snapshot: a sandbox's /init adds its own env vars on top), then
// snapshots the VM and seals its disk.
func (v *buildVM) commit(ctx context.Context, vm *sandbox.VM, disk Disk, built *Template) error {
	step := StepFinalize
	if err := sandbox.InitAgent(ctx, vm.Slot, "", sandbox.InitRequest{EnvVars: v.env, DefaultUser: v.user, DefaultWorkdir: v.workdir}); err != nil {
		return err
	}
	built.DefaultUser, built.DefaultWorkdir, built.Env = v.user, v.workdir, maps.Clone(v.env)
	v.logf("info", step, "snapshotting the build VM")
	if err := vm.Machine.Pause(ctx); err != nil {
		return fmt.Errorf("pause: %w", err)
	}
	if _, err := vm.Machine.Snapshot(ctx, built.Snapshot); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	if err := atomicfile.SyncTree(built.Snapshot); err != nil {
		return err
	}
	if err := fpCommitSnapshotted.Inject(); err != nil {
		return err
	}
	if err := vm.Stop(ctx); err != nil {
		return fmt.Errorf("stop build VM: %w", err)
	}
	cfg, err := disk.Seal(ctx)
	if err != nil {
		return err
	}
	built.RootfsImage = cfg
	return fpCommitSealed.Inject()
}

// clearBuildDir empties a build directory (a retry's leftovers) but its log.
func clearBuildDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("build dir: %w", err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("build dir: %w", err)
	}
	for _, e := range ents {
		if e.Name() != "build.log" {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return fmt.Errorf("build dir: %w", err)
			}
		}
	}
	return nil
}

// baseImage pulls and converts ref (cached by digest) and returns the
// sealed layer; it takes ENV, USER and WORKDIR defaults from the image.
func (b *Builder) baseImage(ctx context.Context, v *buildVM, ref string, built *Template) (string, error) {
	v.logf("info", StepBase, "pulling %s", ref)
	img, err := b.puller.Pull(ctx, ref)
	if err != nil {
		return "", fmt.Errorf("pull %s: %w", ref, err)
	}
	var size int64
	for _, l := range img.Layers {
		size += l.Size
	}
	v.logf("info", StepBase, "pulled %s (%s, %d layers, %d MiB)", img.Ref, img.Digest, len(img.Layers), size>>20)
	rf, err := b.puller.Convert(ctx, img, oci.ConvertOptions{SizeMiB: b.cfg.Image.RootfsSizeMiB, Agent: b.cfg.Image.Agent})
	if err != nil {
		return "", fmt.Errorf("convert %s: %w", ref, err)
	}
	if rf.Cached {
		v.logf("info", StepBase, "using the cached conversion of %s", img.Digest)
	} else {
		v.logf("info", StepBase, "converted %s into a %d MiB root filesystem (%d MiB of layers)", img.Digest, rf.SizeMiB, rf.Bytes>>20)
	}
	built.DiskMiB = rf.SizeMiB
	if img.Config != nil {
		for _, kv := range img.Config.Config.Env {
			if k, val, ok := strings.Cut(kv, "="); ok && k != "" {
				v.env[k] = val
			}
		}
	}
	return rf.Path, nil
}

// variantLayer builds (or finds) the guest image's root filesystem variant
// and imports it as the build's base layer.
func (b *Builder) variantLayer(ctx context.Context, v *buildVM, variant string, built *Template) (string, error) {
	if b.cfg.Image.Rootfs == nil {
		return "", fmt.Errorf("root filesystem variant %s: this node builds no variants", variant)
	}
	v.logf("info", StepBase, "building root filesystem variant %s (Debian packages with apt: minutes, once per node)", variant)
	raw, err := b.cfg.Image.Rootfs(ctx, variant)
	if err != nil {
		return "", fmt.Errorf("root filesystem variant %s: %w", variant, err)
	}
	if st, err := os.Stat(raw); err == nil {
		built.DiskMiB = int(st.Size() >> 20)
	}
	layer := filepath.Join(built.Dir, "rootfs-0.lsmt")
	v.logf("info", StepBase, "importing %s", raw)
	if _, err := storimage.ImportRaw(ctx, raw, layer, storimage.CommitOptions{Message: "guest rootfs variant " + variant}); err != nil {
		return "", fmt.Errorf("root filesystem variant %s: import %s: %w", variant, raw, err)
	}
	return layer, nil
}

func homeOf(user string) string {
	if user == "root" {
		return "/root"
	}
	return "/home/" + user
}

// step runs one build step.
func (v *buildVM) step(ctx context.Context, step string, st BuildStep) error {
	typ := strings.ToUpper(st.Type)
	v.logf("info", step, "%s %s", typ, strings.Join(st.Args, " "))
	switch typ {
	case "ENV":
		for i := 0; i+1 < len(st.Args); i += 2 {
			v.env[st.Args[i]] = st.Args[i+1]
		}
		return nil
	case "ARG":
		if len(st.Args) > 1 {
			v.args[st.Args[0]] = st.Args[1]
		} else if _, ok := v.args[st.Args[0]]; !ok {
			v.args[st.Args[0]] = ""
		}
		return nil
	case "WORKDIR":
		dir := v.abs(st.Args[0])
		script := `[ -d "$1" ] || { mkdir -p "$1" && chown "$2" "$1"; }`
		if err := v.run(ctx, step, "root", "/bin/sh", []string{"-c", script, "sh", dir, v.user}, "/"); err != nil {
			return err
		}
		v.workdir = dir
		return nil
	case "USER":
		user := st.Args[0]
		if err := v.run(ctx, step, user, "/bin/sh", []string{"-c", "true"}, "/"); err != nil {
			return fmt.Errorf("USER %s: %w", user, err)
		}
		if v.user != user && v.workdir == homeOf(v.user) {
			v.workdir = homeOf(user) // E2B: a new user starts in its home unless WORKDIR was set
		}
		v.user = user
		return nil
	case "RUN":
		user := v.user
		if len(st.Args) > 1 && st.Args[1] != "" {
			user = st.Args[1]
		}
		return v.runShell(ctx, step, user, st.Args[0])
	case "COPY", "ADD":
		return v.copy(ctx, step, st)
	}
	return fmt.Errorf("unsupported step type %q", st.Type)
}

// abs resolves p against the current workdir.
func (v *buildVM) abs(p string) string {
	if path.IsAbs(p) {
		return path.Clean(p)
	}
	return path.Join(v.workdir, p)
}

// runShell runs cmd with bash -l -c (sh -c when the image has no bash).
func (v *buildVM) runShell(ctx context.Context, step, user, cmd string) error {
	err := v.run(ctx, step, user, v.bash, []string{"-l", "-c", cmd}, v.workdir)
	if errors.Is(err, errNoBash) && v.bash != "/bin/sh" {
		v.logf("warn", step, "the image has no /bin/bash; using /bin/sh")
		v.bash = "/bin/sh"
		return v.run(ctx, step, user, v.bash, []string{"-c", cmd}, v.workdir)
	}
	return err
}

// run runs a process to its end, logging its output line by line; a
// non-zero exit is an error naming the code.
func (v *buildVM) run(ctx context.Context, step, user, cmd string, args []string, cwd string) error {
	ctx, cancel := context.WithTimeout(ctx, v.b.cfg.Image.StepTimeout)
	defer cancel()
	var last tailLines
	code, err := v.process(ctx, step, user, cmd, args, cwd, nil, &last)
	if err != nil {
		return err
	}
	if code != 0 {
		if out := last.String(); out != "" {
			return fmt.Errorf("exited with code %d; last output:\n%s", code, out)
		}
		return fmt.Errorf("exited with code %d", code)
	}
	return nil
}

// tailLines keeps the last lines of a process's output for error messages.
type tailLines struct{ lines []string }

func (t *tailLines) add(l string) {
	if t == nil {
		return
	}
	t.lines = append(t.lines, l)
	if len(t.lines) > 15 {
		t.lines = t.lines[len(t.lines)-15:]
	}
}

func (t *tailLines) String() string { return strings.Join(t.lines, "\n") }

func (v *buildVM) procEnv() map[string]string {
	env := maps.Clone(v.args)
	for k, val := range v.env {
		env[k] = val
	}
	return env
}

// process starts a process through the agent and follows it until it ends
// (started, when not nil, is called once it runs: the caller may cancel ctx
// to leave it running in the background).
func (v *buildVM) process(ctx context.Context, step, user, cmd string, args []string, cwd string, started func(), last *tailLines) (int, error) {
	client := agentclient.NewProcessClient(v.hc, agentURL)
	stdinOff := false
	req := connect.NewRequest(&pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: cmd, Args: args, Envs: v.procEnv(), Cwd: &cwd},
		Stdin:   &stdinOff,
	})
	req.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	stream, err := client.Start(ctx, req)
	if err != nil {
		return -1, v.startError(cmd, user, err)
	}
	defer stream.Close()
	emit := func(l string) {
		last.add(l)
		v.logf("info", step, "%s", l)
	}
	out, errOut := &lineLogger{emit: emit}, &lineLogger{emit: emit}
	defer out.flush()
	defer errOut.flush()
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if ev.GetStart() != nil && started != nil {
			started()
		}
		if d := ev.GetData(); d != nil {
			out.Write(d.GetStdout())
			out.Write(d.GetPty())
			errOut.Write(d.GetStderr())
		}
		if end := ev.GetEnd(); end != nil {
			return int(end.GetExitCode()), nil
		}
	}
	if err := stream.Err(); err != nil {
		if ctx.Err() != nil {
			return -1, fmt.Errorf("%s: %w", cmd, ctx.Err())
		}
		return -1, v.startError(cmd, user, err)
	}
	return -1, fmt.Errorf("%s: the agent's stream ended without an exit code", cmd)
}

func (v *buildVM) startError(cmd, user string, err error) error {
	switch connect.CodeOf(err) {
	case connect.CodeNotFound:
		if cmd == "/bin/bash" {
			return errNoBash
		}
		return fmt.Errorf("%s: not found in the image: %w", cmd, err)
	case connect.CodeUnauthenticated, connect.CodePermissionDenied, connect.CodeInvalidArgument:
		return fmt.Errorf("run %s as %s: %w", cmd, user, err)
	}
	return fmt.Errorf("run %s: %w", cmd, err)
}

// lineLogger splits output into log lines.
type lineLogger struct {
	buf  []byte
	emit func(string)
}

func (l *lineLogger) Write(b []byte) {
	l.buf = append(l.buf, b...)
	for {
		i := strings.IndexByte(string(l.buf), '\n')
		if i < 0 {
			break
		}
		l.emit(strings.TrimRight(string(l.buf[:i]), "\r"))
		l.buf = l.buf[i+1:]
	}
	if len(l.buf) > maxLogLine {
		l.flush()
	}
}

func (l *lineLogger) flush() {
	if len(l.buf) > 0 {
		l.emit(string(l.buf))
		l.buf = nil
	}
}

// startAndWait starts startCmd in the background and polls readyCmd until
// it exits 0.
func (v *buildVM) startAndWait(ctx context.Context, spec BuildSpec) error {
	step := StepFinalize
	user := v.user
	if spec.RootCommands {
		user = "root"
	}
	if spec.StartCmd != "" {
		v.logf("info", step, "starting %q in the background", spec.StartCmd)
		sctx, cancel := context.WithCancel(ctx)
		defer cancel() // the process lives on without its stream
		started := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			once := false
			code, err := v.process(sctx, step, user, v.bash, []string{"-l", "-c", spec.StartCmd}, v.workdir, func() {
				if !once {
					once = true
					close(started)
				}
			}, nil)
			if err == nil {
				err = fmt.Errorf("start command exited with code %d", code)
			}
			done <- err
		}()
		select {
		case <-started:
		case err := <-done:
			return fmt.Errorf("start command %q: %w", spec.StartCmd, err)
		case <-ctx.Done():
			return ctx.Err()
		}
		defer func() {
			select {
			case err := <-done:
				if sctx.Err() == nil {
					v.logf("warn", step, "start command ended: %v", err)
				}
			default:
			}
		}()
	}
	if spec.ReadyCmd == "" {
		return nil
	}
	wait := max(v.b.cfg.Image.ReadyTimeout, spec.ReadyTimeout)
	v.logf("info", step, "waiting for ready command %q (up to %s)", spec.ReadyCmd, wait)
	deadline := time.Now().Add(wait)
	var last error
	for attempt := 1; ; attempt++ {
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		code, err := v.process(pctx, step, user, v.bash, []string{"-l", "-c", spec.ReadyCmd}, v.workdir, nil, nil)
		cancel()
		if err == nil && code == 0 {
			v.logf("info", step, "ready command succeeded (attempt %d)", attempt)
			return nil
		}
		if err != nil {
			last = err
		} else {
			last = fmt.Errorf("exit code %d", code)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("ready command %q did not succeed within %s (last: %v)", spec.ReadyCmd, wait, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}
