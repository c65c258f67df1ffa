package template

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/agentenv/agentenv/store"
)

// Logs.

// buildDir holds a build's files; short, as QEMU's sockets live in it
// (sun_path holds 107 bytes).
func (b *Builder) buildDir(templateID, buildID string) string {
	short := strings.ReplaceAll(buildID, "-", "")
	if len(short) > 8 {
		short = short[:8]
	}
	return filepath.Join(b.cfg.DataDir, "templates", templateID, "b-"+short)
}

func (b *Builder) buildLog(templateID, buildID, level, step, msg string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.logLocked(templateID, buildID, level, step, msg)
}

func (b *Builder) logLocked(templateID, buildID, level, step, msg string) {
	if len(msg) > maxLogLine {
		msg = msg[:maxLogLine] + "…"
	}
	l := BuildLog{Timestamp: time.Now().UTC(), Level: level, Message: msg, Step: step}
	cur := b.logsLocked(templateID, buildID)
	if len(cur) >= maxBuildLogs {
		if len(cur) == maxBuildLogs {
			l = BuildLog{Timestamp: l.Timestamp, Level: "warn", Message: "log limit reached: further output is dropped", Step: step}
		} else if level != "error" {
			return
		}
	}
	b.logs[buildID] = append(cur, l)
	b.appendLogFile(templateID, buildID, l)
}

func (b *Builder) appendLogFile(templateID, buildID string, l BuildLog) {
	dir := b.buildDir(templateID, buildID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return
	}
	f, err := os.OpenFile(filepath.Join(dir, "build.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return
	}
	defer f.Close()
	line, _ := json.Marshal(l)
	_, _ = f.Write(append(line, '\n'))
}

// logsLocked returns the build's entries, reading its log file once.
func (b *Builder) logsLocked(templateID, buildID string) []BuildLog {
	if l, ok := b.logs[buildID]; ok {
		return l
	}
	var out []BuildLog
	if f, err := os.Open(filepath.Join(b.buildDir(templateID, buildID), "build.log")); err == nil {
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var l BuildLog
			if json.Unmarshal(sc.Bytes(), &l) == nil {
				out = append(out, l)
			}
		}
		f.Close()
	}
	b.logs[buildID] = out
	return out
}

// finish records the outcome of a build; on success t is the committed
// template (its snapshot and disk).
func (b *Builder) finish(templateID, buildID string, built *Template, berr error, step string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	cur := b.recs[templateID]
	if cur == nil { // deleted meanwhile (cannot happen while building)
		return
	}
	t := cur.Clone()
	br := t.Builds[buildID]
	br.FinishedAt, br.PID = time.Now().UTC(), 0
	if berr != nil {
		br.Status, br.Reason, br.ReasonStep = BuildError, berr.Error(), step
		b.logLocked(templateID, buildID, "error", step, "build failed: "+berr.Error())
		if !t.Ready() || t.Snapshot == "" {
			t.Status = BuildError
		}
	} else {
		br.Status = BuildReady
		t.Snapshot, t.RootfsImage, t.DiskMiB, t.DriveSlots = built.Snapshot, built.RootfsImage, built.DiskMiB, built.DriveSlots
		t.Dir, t.BuildID, t.Parent = built.Dir, buildID, built.Parent
		t.Origin = "" // this node's own build now: committed from here (adopt.go)
		t.DefaultUser, t.DefaultWorkdir, t.Env = built.DefaultUser, built.DefaultWorkdir, built.Env
		t.VCPUs, t.MemoryMiB = built.VCPUs, built.MemoryMiB
		t.Status = BuildReady
		b.logLocked(templateID, buildID, "info", StepFinalize, "build finished: template "+templateID+" is ready")
	}
	t.UpdatedAt = br.FinishedAt
	if err := b.cfg.Store.Put(store.Templates, t.ID, t); err != nil {
		b.log.Error("persist build result", "template", templateID, "build", buildID, "err", err)
	}
	b.recs[t.ID] = t
	if berr == nil {
		b.host.Publish(t.Clone())
	}
}

func (b *Builder) setPID(templateID, buildID string, pid int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	t := b.recs[templateID]
	if t == nil || t.Builds[buildID] == nil {
		return
	}
	t = t.Clone()
	t.Builds[buildID].PID = pid
	b.recs[t.ID] = t
	_ = b.cfg.Store.Put(store.Templates, t.ID, t)
}

func (b *Builder) worker() {
	defer b.wg.Done()
	for {
		select {
		case <-b.ctx.Done():
			return
		case job := <-b.queue:
			b.run(job)
		}
	}
}

func (b *Builder) run(job buildJob) {
	b.mu.Lock()
	t := b.recs[job.templateID]
	var spec BuildSpec
	var tc *Template
	if t != nil && t.Builds[job.buildID] != nil && t.Builds[job.buildID].Spec != nil {
		spec = *t.Builds[job.buildID].Spec
		tc = t.Clone()
	}
	b.mu.Unlock()
	if tc == nil {
		return
	}
	start := time.Now()
	b.buildLog(job.templateID, job.buildID, "info", StepBase, "build started")
	built, step, err := b.execute(b.ctx, tc, job.buildID, spec)
	if err != nil && b.ctx.Err() != nil {
		return // shutting down: the next start marks the build interrupted
	}
	if err != nil {
		// Only the log of a failed build is worth keeping.
		if cerr := clearBuildDir(b.buildDir(job.templateID, job.buildID)); cerr != nil {
			b.log.Warn("clean failed build", "build", job.buildID, "err", cerr)
		}
	}
	b.finish(job.templateID, job.buildID, built, err, step)
	b.log.Info("template build finished", "template", job.templateID, "build", job.buildID,
		"ok", err == nil, "took", time.Since(start).Round(time.Millisecond))
}

var errNoBash = errors.New("no /bin/bash in the image")
