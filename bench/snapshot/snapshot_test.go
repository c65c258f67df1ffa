package snapshotbench

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/testutil/cpustat"
)

const (
	sharedVMs = 10 // sandboxes restored from one snapshot
	dirtyMiB  = 64 // tmpfs the snapshot's source writes before the snapshot
)

// BenchmarkSharedMemoryPSS: ten sandboxes restored from one snapshot share
// its memory image. The sum of their VMM processes' PSS is compared with
// ten private copies of the image: 10 x guest RAM, and 10 x the image's
// non-zero bytes (what a copy that skips zero pages would cost).
func BenchmarkSharedMemoryPSS(b *testing.B) {
	n := sharedNode(b)
	for range b.N {
		src := n.create(b, "base")
		filled := n.fill(b, src, dirtyMiB)
		snap := n.snapshot(b, src)
		n.mustKill(b, src)
		var ids []string
		defer func() {
			n.mustKill(b, ids...)
			n.Call("DELETE", "/snapshots/"+snap.SnapshotID, n.Key, "")
		}()
		pids := map[string]int{}
		start := func() {
			id := n.create(b, snap.SnapshotID)
			ids = append(ids, id)
			want := strconv.Itoa(filled << 20)
			if got := n.sh(b, id, `stat -c %s /dev/shm/fill`); got != want {
				b.Fatalf("sandbox %s from the snapshot: /dev/shm/fill is %s bytes, want %s", id, got, want)
			}
			pid, err := vmmPID(id)
			if err != nil {
				b.Fatal(err)
			}
			pids[id] = pid
		}

		start()
		alone := settle(b, pids)[ids[0]]
		aloneRAM, image, err := guestRAM(pids[ids[0]])
		if err != nil {
			b.Fatal(err)
		}
		aloneMaps, err := mappings(pids[ids[0]])
		if err != nil {
			b.Fatal(err)
		}
		for len(ids) < sharedVMs {
			start()
		}
		all := settle(b, pids)

		var sum, ram, tcg memStats
		files := map[string]bool{}
		for _, id := range ids {
			add(&sum, all[id])
			m, path, err := guestRAM(pids[id])
			if err != nil {
				b.Fatal(err)
			}
			add(&ram, m)
			files[path] = true
			maps, err := mappings(pids[id])
			if err != nil {
				b.Fatal(err)
			}
			add(&tcg, tcgBuffer(maps))
		}
		if len(files) != 1 {
			b.Fatalf("%d sandboxes from one snapshot map %d memory files: %v", sharedVMs, len(files), files)
		}
		allocated, nonZero, err := imageBytes(image)
		if err != nil {
			b.Fatal(err)
		}
		cached, err := pageCacheBytes(image)
		if err != nil {
			b.Fatal(err)
		}
		guest := aloneRAM.Size
		vsRAM := 100 * (1 - float64(sum.Pss)/float64(sharedVMs*guest))
		vsData := 100 * (1 - float64(sum.Pss)/float64(int64(sharedVMs)*nonZero))

		fmt.Println()
		say("snapshot %s (source dirtied %d MiB of tmpfs): guest RAM %.0f MiB; image %s: non-zero %.1f MiB, allocated %.1f MiB, in host page cache %.1f MiB",
			snap.SnapshotID, filled, mib(guest), filepath.Base(image), mib(nonZero), mib(allocated), mib(cached))
		say("one VM alone: Pss %.1f MiB = Pss_File %.1f (shared file-backed) + Pss_Anon %.1f + Pss_Shmem %.1f; Rss %.1f, AnonHugePages %.1f",
			mib(alone.Pss), mib(alone.PssFile), mib(alone.PssAnon), mib(alone.PssShmem), mib(alone.Rss), mib(alone.AnonHuge))
		say("  its guest RAM mapping: Rss %.1f MiB, Pss %.1f, copied on write (Anonymous) %.1f, THP %.1f; outside guest RAM (QEMU, TCG code buffer, libraries): Pss %.1f",
			mib(aloneRAM.Rss), mib(aloneRAM.Pss), mib(aloneRAM.Anonymous), mib(aloneRAM.AnonHuge), mib(alone.Pss-aloneRAM.Pss))
		say("%d VMs: sum Pss %.1f MiB (%.1f per VM) = Pss_File %.1f + Pss_Anon %.1f + Pss_Shmem %.1f; sum Rss %.1f (what unshared touched pages would cost)",
			sharedVMs, mib(sum.Pss), mib(sum.Pss)/sharedVMs, mib(sum.PssFile), mib(sum.PssAnon), mib(sum.PssShmem), mib(sum.Rss))
		say("  guest RAM mappings: sum Pss %.1f MiB, copied on write %.1f (%.1f per VM); outside guest RAM: sum Pss %.1f (%.1f per VM)",
			mib(ram.Pss), mib(ram.Anonymous), mib(ram.Anonymous)/sharedVMs, mib(sum.Pss-ram.Pss), mib(sum.Pss-ram.Pss)/sharedVMs)
		say("vs %d x guest RAM (%.0f MiB): saved %.1f%% (goal >= 85%%)", sharedVMs, mib(sharedVMs*guest), vsRAM)
		say("vs %d x non-zero image (%.1f MiB): saved %.1f%%", sharedVMs, mib(int64(sharedVMs)*nonZero), vsData)
		say("  the largest mappings of the VM alone outside guest RAM: %s", topMappings(aloneMaps, image, 5))
		say("  TCG translation buffers (anonymous rwx; KVM has none): sum Pss %.1f MiB (%.1f per VM), AnonHugePages %.1f; without them: saved %.1f%% vs RAM, %.1f%% vs non-zero",
			mib(tcg.Pss), mib(tcg.Pss)/sharedVMs, mib(tcg.AnonHuge),
			100*(1-float64(sum.Pss-tcg.Pss)/float64(sharedVMs*guest)), 100*(1-float64(sum.Pss-tcg.Pss)/float64(int64(sharedVMs)*nonZero)))
		say("host: THP %s, KSM run=%s; VMM THP_enabled %s (0 with SNBENCH_THP_DISABLE=1)", sysfs("kernel/mm/transparent_hugepage/enabled"),
			sysfs("kernel/mm/ksm/run"), procStatus(pids[ids[0]], "THP_enabled"))
		say("guest RAM mappings alone vs %d x guest RAM: saved %.1f%%", sharedVMs, 100*(1-float64(ram.Pss)/float64(sharedVMs*guest)))
		b.ReportMetric(vsRAM, "saved-%-vs-RAM")
		b.ReportMetric(vsData, "saved-%-vs-nonzero")
		b.ReportMetric(mib(sum.Pss), "sum-PSS-MiB")
		b.ReportMetric(mib(alone.Pss), "alone-PSS-MiB")
	}
}

// topMappings formats the count largest mappings by Pss other than the
// memory image.
func topMappings(maps []mapping, image string, count int) string {
	var rest []mapping
	for _, m := range maps {
		if m.Path != image {
			rest = append(rest, m)
		}
	}
	sort.Slice(rest, func(i, j int) bool { return rest[i].Pss > rest[j].Pss })
	var parts []string
	for _, m := range rest[:min(count, len(rest))] {
		name := m.Path
		if name == "" {
			name = "[anon]"
		}
		parts = append(parts, fmt.Sprintf("%s %s size %.0f MiB Pss %.1f (THP %.1f)", filepath.Base(name), m.Perms, mib(m.Size), mib(m.Pss), mib(m.AnonHuge)))
	}
	return strings.Join(parts, "; ")
}

// procStatus returns one field of /proc/<pid>/status ("?" if absent).
func procStatus(pid int, key string) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "?"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == key {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}

func sysfs(path string) string {
	b, err := os.ReadFile("/sys/" + path)
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(b))
}

func add(sum *memStats, m memStats) {
	sum.Size += m.Size
	sum.Rss += m.Rss
	sum.Pss += m.Pss
	sum.PssAnon += m.PssAnon
	sum.PssFile += m.PssFile
	sum.PssShmem += m.PssShmem
	sum.SharedClean += m.SharedClean
	sum.PrivateClean += m.PrivateClean
	sum.PrivateDirty += m.PrivateDirty
	sum.Anonymous += m.Anonymous
	sum.AnonHuge += m.AnonHuge
}

// settle samples the processes' smaps_rollup every 2 s until their summed
// PSS changed by less than 1% twice in a row (at most 90 s) and returns
// the last sample.
func settle(b *testing.B, pids map[string]int) map[string]memStats {
	b.Helper()
	var last int64
	calm := 0
	deadline := time.Now().Add(90 * time.Second)
	for {
		cur := map[string]memStats{}
		var total int64
		for id, pid := range pids {
			m, err := rollup(pid)
			if err != nil {
				b.Fatalf("sandbox %s (pid %d): %v", id, pid, err)
			}
			cur[id] = m
			total += m.Pss
		}
		if last > 0 && abs(total-last)*100 < last {
			calm++
		} else {
			calm = 0
		}
		if calm >= 2 || time.Now().After(deadline) {
			return cur
		}
		last = total
		time.Sleep(2 * time.Second)
	}
}

func abs(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

// BenchmarkPauseVsDirtied: pause time of a sandbox fresh from the template
// after its guest dirtied ~0%, 10%, 50% and 100% of its RAM (tmpfs filled
// with non-zero bytes, up to what fits), against the ~0% pause and a host
// cp (+fsync) of as many bytes as the memory diff, both measured here; and
// the restore-to-ready (resume) time of each.
func BenchmarkPauseVsDirtied(b *testing.B) {
	n := sharedNode(b)
	tmp := b.TempDir()
	for range b.N {
		fmt.Println()
		var refPause, refResume time.Duration
		var creates, resumes, flatResumes []time.Duration
		for _, pct := range []int{0, 10, 50, 100} {
			c0 := time.Now()
			id := n.create(b, "base")
			creates = append(creates, time.Since(c0))
			written := 0
			if pct > 0 {
				written = n.fill(b, id, guestMiB*pct/100)
			} else {
				n.sh(b, id, `true`)
			}
			off := len(n.Logs())
			pauseBefore := n.stageSums(b, "pause")
			t0 := time.Now()
			_, pause := n.expect(b, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", "")
			steps := n.timeline(off, t0, id) + "; stages: " + stageMeans(pauseBefore, n.stageSums(b, "pause"))
			diff := n.oneLog(b, off, "memory diff captured", "sandbox="+id)
			var flatten time.Duration
			if ls := n.logsSince(off, "memory image materialized", id); len(ls) == 1 {
				flatten = ls[0].dur("took")
			}
			resume, stages := n.resume(b, id, written)
			resumes = append(resumes, resume)
			flatResume, flatStages, flattened := n.resumeFlattened(b, id, written)
			flatResumes = append(flatResumes, flatResume)
			n.mustKill(b, id)

			layer := diff.int("bytes")
			cp, cpSync := hostCopy(b, tmp, layer)
			if pct == 0 {
				refPause, refResume = pause, resume
			}
			dirtied := float64(diff.int("pages")+diff.int("zero_pages")) * 4096
			say("dirty %3d%% (guest wrote %d MiB of tmpfs): diff %.1f MiB dirtied (%d data + %d zero pages), layer %.1f MiB",
				pct, written, dirtied/(1<<20), diff.int("pages"), diff.int("zero_pages"), mib(layer))
			say("  pause %s (diff capture %s, flatten for resume %s) = %.2fx the ~0%% pause; host cp of %.1f MiB %s, cp+fsync %s: pause/cp+fsync %.1fx, capture/cp+fsync %.1fx",
				ms(pause), ms(diff.dur("took")), ms(flatten), ratio(pause, refPause), mib(layer), ms(cp), ms(cpSync),
				ratio(pause, cpSync), ratio(diff.dur("took"), cpSync))
			floor := diff.dur("took") + cpSync
			say("  pause %.2fx the memory diff capture + cp+fsync of the diff (%s; goal <= 1.5x)", ratio(pause, floor), ms(floor))
			say("  pause steps: %s", steps)
			say("  resume to ready at once %s = %.2fx the ~0%% resume (%s)", ms(resume), ratio(resume, refResume), stages)
			again := "memory flattened in " + ms(flattened)
			if flattened == 0 {
				again = "nothing flattened (the memory export of the stack)"
			}
			say("  paused again, %s: resume to ready %s = %.2fx the one at once (%s)",
				again, ms(flatResume), ratio(flatResume, resume), flatStages)
			tag := fmt.Sprintf("-%d%%", pct)
			b.ReportMetric(pause.Seconds()*1000, "pause-ms"+tag)
			b.ReportMetric(resume.Seconds()*1000, "resume-ms"+tag)
			b.ReportMetric(flatResume.Seconds()*1000, "resume-flat-ms"+tag)
			b.ReportMetric(ratio(pause, cpSync), "pause/cp"+tag)
			b.ReportMetric(ratio(pause, floor), "pause/floor"+tag)
		}
		rp, fp, cp := medianDur(resumes), medianDur(flatResumes), medianDur(creates)
		say("resume p50 vs create p50 %s (the same sandboxes' creates from the template; goal <= 1.2x): once the pause's memory is flattened %s = %.2fx; at once after the pause %s = %.2fx",
			ms(cp), ms(fp), ratio(fp, cp), ms(rp), ratio(rp, cp))
		b.ReportMetric(ratio(fp, cp), "resume-p50/create-p50")
		b.ReportMetric(ratio(rp, cp), "resume-at-once-p50/create-p50")
	}
}

// resume resumes the paused sandbox id at once and checks the guest's
// tmpfs fill of written MiB; it returns the time to ready and the mean
// resume stages.
func (n *node) resume(b *testing.B, id string, written int) (time.Duration, string) {
	before := n.stageSums(b, "resume")
	_, took := n.expect(b, http.StatusCreated, "POST", "/sandboxes/"+id+"/connect", `{"timeout":600}`)
	stages := stageMeans(before, n.stageSums(b, "resume"))
	if written > 0 {
		n.checkFill(b, id, written)
	} else {
		n.sh(b, id, `true`)
	}
	return took, stages
}

// resumeFlattened pauses the running sandbox id again, waits until the
// node flattened its memory in the background, and resumes it (see
// resume); flattened is how long the flatten took. Where VMs map the
// storage daemon's memory exports nothing is flattened: it is a second
// pause and resume.
func (n *node) resumeFlattened(b *testing.B, id string, written int) (resume time.Duration, stages string, flattened time.Duration) {
	off := len(n.Logs())
	n.expect(b, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", "")
	if n.memoryExports(b) {
		resume, stages = n.resume(b, id, written)
		return resume, stages, 0
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if ls := n.logsSince(off, "paused memory flattened", "sandbox="+id); len(ls) == 1 {
			flattened = ls[0].dur("took")
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("sandbox %s: no \"paused memory flattened\" within 2 minutes of its pause", id)
		}
		time.Sleep(50 * time.Millisecond)
	}
	resume, stages = n.resume(b, id, written)
	return resume, stages, flattened
}

// cpuBusy is the machine's CPU time busy so far (cpustat.Busy).
func cpuBusy(b *testing.B) time.Duration {
	d, err := cpustat.Busy()
	if err != nil {
		b.Fatal(err)
	}
	return d
}

// medianDur is the median of d (the upper one of an even count).
func medianDur(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func ratio(a, b time.Duration) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// hostCopy times `cp` of a host file of size bytes (non-zero, in the page
// cache, as guest RAM is) and the fsync of the copy: a memory diff is
// written and synced the same way.
func hostCopy(b *testing.B, dir string, size int64) (cp, cpSync time.Duration) {
	b.Helper()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	defer os.Remove(src)
	defer os.Remove(dst)
	f, err := os.Create(src)
	if err != nil {
		b.Fatal(err)
	}
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = byte(i*7 + 1)
	}
	for left := size; left > 0; left -= int64(len(chunk)) {
		if _, err := f.Write(chunk[:min(int64(len(chunk)), left)]); err != nil {
			b.Fatal(err)
		}
	}
	if err := errors.Join(f.Sync(), f.Close()); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if out, err := exec.Command("cp", src, dst).CombinedOutput(); err != nil {
		b.Fatalf("cp: %v %s", err, out)
	}
	cp = time.Since(start)
	g, err := os.OpenFile(dst, os.O_RDWR, 0)
	if err != nil {
		b.Fatal(err)
	}
	if err := errors.Join(g.Sync(), g.Close()); err != nil {
		b.Fatal(err)
	}
	return cp, time.Since(start)
}

type forkResult struct {
	Sandbox *struct {
		SandboxID string `json:"sandboxID"`
	} `json:"sandbox"`
	Error *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// BenchmarkFork: POST /sandboxes/{id}/fork wall time for 1 and 10 children
// (and per child) against one plain create from the template in the same
// run; every child must see the source's disk and memory state.
func BenchmarkFork(b *testing.B) {
	n := sharedNode(b)
	for range b.N {
		fmt.Println()
		before := n.stageSums(b, "create")
		cpu0 := cpuBusy(b)
		start := time.Now()
		ref := n.create(b, "base")
		create := time.Since(start)
		createCPU := cpuBusy(b) - cpu0
		say("reference: one create from the template %s, %s of CPU busy on the machine (%s)", ms(create), ms(createCPU), stageMeans(before, n.stageSums(b, "create")))
		n.mustKill(b, ref)

		src := n.create(b, "base")
		defer n.mustKill(b, src)
		n.sh(b, src, `echo disk > /home/user/fork-marker && echo mem > /dev/shm/fork-marker`)
		for _, count := range []int{1, 10} {
			off := len(n.Logs())
			before := n.stageSums(b, "create")
			cpu0 := cpuBusy(b)
			t0 := time.Now()
			out, took := n.expect(b, http.StatusCreated, "POST", "/sandboxes/"+src+"/fork", fmt.Sprintf(`{"count":%d,"timeout":600}`, count))
			forkCPU := cpuBusy(b) - cpu0
			stages := stageMeans(before, n.stageSums(b, "create"))
			var kids []forkResult
			if err := json.Unmarshal(out, &kids); err != nil || len(kids) != count {
				b.Fatalf("fork %d: %s (%v)", count, out, err)
			}
			var ids []string
			for i, k := range kids {
				if k.Error != nil || k.Sandbox == nil {
					n.mustKill(b, ids...)
					b.Fatalf("fork %d: child %d failed: %s", count, i, out)
				}
				ids = append(ids, k.Sandbox.SandboxID)
			}
			for _, id := range ids {
				if got := n.sh(b, id, `cat /home/user/fork-marker /dev/shm/fork-marker`); got != "disk\nmem" {
					n.mustKill(b, ids...)
					b.Fatalf("fork child %s sees %q, want the source's disk and mem markers", id, got)
				}
			}
			n.mustKill(b, ids...)
			capture := n.oneLog(b, off, "memory diff captured", "sandbox="+src).dur("took")
			var flatten time.Duration
			if ls := n.logsSince(off, "memory image materialized"); len(ls) == 1 {
				flatten = ls[0].dur("took")
			}
			per := took / time.Duration(count)
			steps := n.timeline(off, t0, src)
			goal := map[int]string{1: "goal <= 1.5x", 10: "goal <= 0.5x per child"}[count]
			say("fork %2d: %s wall, %s per child = %.2fx one create (%s; wall %.2fx); source memory diff %s, image flatten %s; children's create stages: %s",
				count, ms(took), ms(per), ratio(per, create), goal, ratio(took, create), ms(capture), ms(flatten), stages)
			say("  source steps: %s", steps)
			// CPU-bound or waiting: the machine's CPU time busy per child
			// against a lone create's, and the share of every core busy.
			say("  CPU busy %s per child = %.2fx a lone create's; %.0f%% of the machine's %d cores busy during the fork",
				ms(forkCPU/time.Duration(count)), ratio(forkCPU/time.Duration(count), createCPU),
				100*forkCPU.Seconds()/(took.Seconds()*float64(runtime.NumCPU())), runtime.NumCPU())
			b.ReportMetric(took.Seconds()*1000, fmt.Sprintf("fork%d-ms", count))
			b.ReportMetric(ratio(per, create), fmt.Sprintf("fork%d-per-child/create", count))
		}
		b.ReportMetric(create.Seconds()*1000, "create-ms")
	}
}
