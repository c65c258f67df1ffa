package oci

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/oci/unpack"
	"github.com/agentenv/agentenv/storage/image"
	"github.com/agentenv/agentenv/storage/zfile"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// convertVersion changes whenever Convert's output for the same input does.
const convertVersion = "1"

// AgentPath is where the agent binary is injected in the root filesystem.
const AgentPath = "/usr/bin/aenv-agent"

// DefaultUser is the unprivileged user every template has (as in E2B).
const DefaultUser = "user"

// ConvertOptions describe the root filesystem made from an image.
type ConvertOptions struct {
	// SizeMiB is the ext4 filesystem size; 0 sizes it from the content
	// (content + 25% + 64 MiB).
	SizeMiB int
	// Agent is a static aenv-agent binary injected at AgentPath (none when empty).
	Agent string
	// Hostname written to /etc/hostname and /etc/hosts ("aenv" when empty).
	Hostname string
	// Nameservers for /etc/resolv.conf (8.8.8.8 when empty).
	Nameservers []string
	// Compress stores the layer as a ZFile.
	Compress *zfile.Options
	// MaxBytes bounds the file bytes the layers may unpack (default: the
	// filesystem size when SizeMiB is set, else DefaultMaxBytes).
	MaxBytes int64
}

// DefaultMaxBytes bounds what an image's layers may unpack to.
const DefaultMaxBytes = 64 << 30

// Rootfs is a converted image.
type Rootfs struct {
	Path    string // the sealed LSMT layer (a bootable ext4 disk)
	Key     string // cache key
	Digest  string // image manifest digest
	SizeMiB int    // filesystem size
	Cached  bool   // true when an earlier conversion was reused
	Bytes   int64  // uncompressed layer bytes applied (0 when cached)
}

// Open returns the uncompressed tar stream of a cached layer blob. The
// stream's sha256 is checked against the layer's diff ID at EOF.
func (l Layer) Open() (io.ReadCloser, error) {
	f, err := os.Open(l.Path)
	if err != nil {
		return nil, fmt.Errorf("oci: open layer %s: %w", l.Digest, err)
	}
	br := bufio.NewReaderSize(f, 1<<20)
	magic, _ := br.Peek(4)
	var r io.Reader = br
	closeFn := f.Close
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		gz, err := gzip.NewReader(br)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("oci: layer %s: gzip: %w", l.Digest, err)
		}
		r = gz
	case bytes.HasPrefix(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1))
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("oci: layer %s: zstd: %w", l.Digest, err)
		}
		r = zr
		closeFn = func() error { zr.Close(); return f.Close() }
	}
	d := &diffIDReader{r: r, h: sha256.New(), want: l.DiffID.Hex, name: l.Digest.String()}
	return newReadahead(d, closeFn), nil
}

// readahead decompresses and hashes in its own goroutine, a few chunks ahead
// of the consumer (as `tar -xz` runs gzip in another process).
type readahead struct {
	ch    chan chunk
	stop  chan struct{}
	done  chan struct{}
	cur   []byte
	err   error
	close func() error
}

type chunk struct {
	b   []byte
	err error
}

func newReadahead(r io.Reader, closeFn func() error) *readahead {
	ra := &readahead{ch: make(chan chunk, 4), stop: make(chan struct{}), done: make(chan struct{}), close: closeFn}
	go func() {
		defer close(ra.done)
		defer close(ra.ch)
		for {
			b := make([]byte, 256<<10)
			n, err := fill(r, b)
			select {
			case ra.ch <- chunk{b[:n], err}:
			case <-ra.stop:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return ra
}

// fill reads until b is full or r fails, and returns r's own error: unlike
// io.ReadFull it never turns a decompressor's io.ErrUnexpectedEOF (a
// truncated stream) into an end that looks clean and skips the diff ID check.
func fill(r io.Reader, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := r.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func (ra *readahead) Read(b []byte) (int, error) {
	for len(ra.cur) == 0 {
		if ra.err != nil {
			return 0, ra.err
		}
		c, ok := <-ra.ch
		if !ok {
			return 0, io.ErrClosedPipe
		}
		ra.cur, ra.err = c.b, c.err
	}
	n := copy(b, ra.cur)
	ra.cur = ra.cur[n:]
	return n, nil
}

func (ra *readahead) Close() error {
	close(ra.stop)
	<-ra.done
	return ra.close()
}

type diffIDReader struct {
	r    io.Reader
	h    hash.Hash
	want string
	name string
}

func (d *diffIDReader) Read(b []byte) (int, error) {
	n, err := d.r.Read(b)
	d.h.Write(b[:n])
	if err == io.EOF {
		if got := hex.EncodeToString(d.h.Sum(nil)); got != d.want {
			return n, fmt.Errorf("oci: layer %s: uncompressed digest sha256:%s does not match diff ID sha256:%s", d.name, got, d.want)
		}
	}
	return n, err
}

func (p *Puller) convertKey(img *Image, opt ConvertOptions) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "v%s\n%s\n%d\n%s\n%q\n", convertVersion, img.Digest, opt.SizeMiB, opt.Hostname, opt.Nameservers)
	if opt.Compress != nil {
		b, _ := json.Marshal(opt.Compress)
		h.Write(b)
	}
	if opt.Agent != "" {
		f, err := os.Open(opt.Agent)
		if err != nil {
			return "", fmt.Errorf("oci: agent %s: %w", opt.Agent, err)
		}
		defer f.Close()
		if _, err := io.Copy(h, f); err != nil {
			return "", fmt.Errorf("oci: agent %s: %w", opt.Agent, err)
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:32], nil
}

// Convert turns a pulled image into a bootable ext4 root filesystem stored as
// a sealed LSMT layer, cached under CacheDir/rootfs/<key>/rootfs.lsmt (the
// key covers the image digest and the options). The layers are unpacked
// into a build directory (see oci/unpack), the agent, /etc/hosts,
// /etc/resolv.conf and the default user are injected, and `mke2fs -d` makes
// the filesystem inside the layer file itself, which storage/image seals
// around it in place (image.BuildRaw): the content is written twice (tree,
// filesystem), never copied a third time when uncompressed, and synced
// once. bench/oci measures it against `tar -x` of the same layers.
func (p *Puller) Convert(ctx context.Context, img *Image, opt ConvertOptions) (*Rootfs, error) {
	if opt.Hostname == "" {
		opt.Hostname = "aenv"
	}
	if len(opt.Nameservers) == 0 {
		opt.Nameservers = []string{"8.8.8.8"}
	}
	key, err := p.convertKey(img, opt)
	if err != nil {
		return nil, err
	}
	base := filepath.Join(p.opt.CacheDir, "rootfs")
	final := filepath.Join(base, key)
	if meta, err := readMeta(final); err == nil {
		meta.Path, meta.Cached = filepath.Join(final, "rootfs.lsmt"), true
		return meta, nil
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		return nil, fmt.Errorf("oci: convert %s: %w", img.Ref, err)
	}
	build, err := os.MkdirTemp(base, ".build-"+key[:8]+"-")
	if err != nil {
		return nil, fmt.Errorf("oci: convert %s: %w", img.Ref, err)
	}
	defer os.RemoveAll(build)
	start := time.Now()
	tree := filepath.Join(build, "tree")
	res, err := p.buildTree(ctx, img, tree, opt)
	if err != nil {
		return nil, err
	}
	res.Key, res.Digest = key, img.Digest.String()
	unpacked := time.Now()
	plan, err := planExt4(tree, opt.SizeMiB)
	if err != nil {
		return nil, fmt.Errorf("oci: convert %s: %w", img.Ref, err)
	}
	res.SizeMiB = plan.sizeMiB
	out := filepath.Join(build, "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		return nil, fmt.Errorf("oci: convert %s: %w", img.Ref, err)
	}
	var mkfsDone time.Time
	var removing sync.WaitGroup
	defer removing.Wait()
	mkfs := func(ctx context.Context, path string, off int64) error {
		err := plan.make(ctx, tree, path, off)
		mkfsDone = time.Now()
		// The tree is garbage once mke2fs has copied it: removing its
		// thousands of inodes overlaps the sealing instead of following it.
		removing.Go(func() { os.RemoveAll(tree) })
		return err
	}
	// mke2fs formats the filesystem inside the layer file, which is sealed
	// around it in place (storage/image.BuildRaw): no raw copy to import.
	if _, err := image.BuildRaw(ctx, filepath.Join(out, "rootfs.lsmt"), int64(plan.sizeMiB)<<20,
		image.CommitOptions{Message: "oci " + img.Ref + "@" + img.Digest.String(), Compress: opt.Compress}, mkfs); err != nil {
		return nil, fmt.Errorf("oci: convert %s: make layer: %w", img.Ref, err)
	}
	mb, _ := json.Marshal(res)
	if err := atomicfile.WriteFile(filepath.Join(out, "meta.json"), mb, 0o600); err != nil {
		return nil, fmt.Errorf("oci: convert %s: %w", img.Ref, err)
	}
	if err := atomicfile.Rename(out, final); err != nil {
		// Another conversion of the same key won the race: use it.
		if meta, merr := readMeta(final); merr == nil {
			meta.Path, meta.Cached = filepath.Join(final, "rootfs.lsmt"), true
			return meta, nil
		}
		return nil, fmt.Errorf("oci: convert %s: store: %w", img.Ref, err)
	}
	res.Path = filepath.Join(final, "rootfs.lsmt")
	p.opt.Log.Info("oci: converted", "ref", img.Ref, "digest", img.Digest, "layer", res.Path,
		"size_mib", res.SizeMiB, "took", time.Since(start).Round(time.Millisecond),
		"unpack", unpacked.Sub(start).Round(time.Millisecond), "mke2fs", mkfsDone.Sub(unpacked).Round(time.Millisecond))
	return res, nil
}

func readMeta(dir string) (*Rootfs, error) {
	b, err := os.ReadFile(filepath.Join(dir, "meta.json"))
	if err != nil {
		return nil, err
	}
	var r Rootfs
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(dir, "rootfs.lsmt")); err != nil {
		return nil, err
	}
	return &r, nil
}

// buildTree unpacks the image's layers into tree and injects our files.
func (p *Puller) buildTree(ctx context.Context, img *Image, tree string, opt ConvertOptions) (*Rootfs, error) {
	root, err := unpack.OpenRoot(tree)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	setLimits(root, opt)
	res := &Rootfs{}
	for i, l := range img.Layers {
		n, err := ApplyLayer(ctx, root, l)
		if err != nil {
			return nil, fmt.Errorf("oci: convert %s: layer %d: %w", img.Ref, i, err)
		}
		res.Bytes += n
	}
	if err := Inject(root, opt); err != nil {
		return nil, fmt.Errorf("oci: convert %s: %w", img.Ref, err)
	}
	return res, nil
}

// setLimits bounds what an image's layers may unpack into root: the bytes
// (content, names, link targets and inodes of every entry kind) by
// opt.MaxBytes or the filesystem size, entries, inodes and path lengths by
// unpack's defaults.
func setLimits(root *unpack.Root, opt ConvertOptions) {
	root.MaxBytes = opt.MaxBytes
	if root.MaxBytes <= 0 {
		root.MaxBytes = DefaultMaxBytes
		if opt.SizeMiB > 0 {
			root.MaxBytes = int64(opt.SizeMiB) << 20
		}
	}
}

// ApplyLayer applies one cached layer to root, verifying its diff ID, and
// returns the uncompressed bytes read.
func ApplyLayer(ctx context.Context, root *unpack.Root, l Layer) (int64, error) {
	rc, err := l.Open()
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	cr := &countReader{r: rc}
	if _, err := root.Apply(ctx, cr); err != nil {
		return cr.n, fmt.Errorf("layer %s: %w", l.Digest, err)
	}
	// Read past the tar end (padding) so the diff ID covers the whole stream.
	if _, err := io.Copy(io.Discard, cr); err != nil {
		return cr.n, err
	}
	return cr.n, nil
}

type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n += int64(n)
	return n, err
}

// Inject writes the agent, /etc/hostname, /etc/hosts, /etc/resolv.conf and
// the default user (uid 1000 when free, home /home/user) into root, editing
// /etc/passwd, /etc/group and /etc/shadow directly (images may have no useradd).
func Inject(root *unpack.Root, opt ConvertOptions) error {
	if opt.Hostname == "" {
		opt.Hostname = "aenv"
	}
	if len(opt.Nameservers) == 0 {
		opt.Nameservers = []string{"8.8.8.8"}
	}
	if opt.Agent != "" {
		if err := root.CopyFile(AgentPath, opt.Agent, 0o755, 0, 0); err != nil {
			return fmt.Errorf("inject agent: %w", err)
		}
	}
	hosts := fmt.Sprintf("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t%s\n", opt.Hostname)
	var resolv strings.Builder
	for _, ns := range opt.Nameservers {
		fmt.Fprintf(&resolv, "nameserver %s\n", ns)
	}
	for _, f := range []struct{ path, data string }{
		{"/etc/hostname", opt.Hostname + "\n"}, {"/etc/hosts", hosts}, {"/etc/resolv.conf", resolv.String()},
	} {
		if err := root.WriteFile(f.path, []byte(f.data), 0o644, 0, 0); err != nil {
			return fmt.Errorf("inject %s: %w", f.path, err)
		}
	}
	return addUser(root, DefaultUser)
}

// readLines reads an /etc database (missing is empty). Only a regular file
// is read: anything else an image puts there (a FIFO, a device node) is an
// error, never opened (see unpack.Root.ReadFile).
func readLines(root *unpack.Root, path string) ([]string, error) {
	b, err := root.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	s := strings.TrimRight(string(b), "\n")
	if s == "" {
		return nil, nil
	}
	return strings.Split(s, "\n"), nil
}

// ids returns the name -> field 2 (uid or gid) map of a passwd/group file.
func ids(lines []string) (map[string]int, map[int]bool) {
	byName, used := map[string]int{}, map[int]bool{}
	for _, l := range lines {
		f := strings.Split(l, ":")
		if len(f) < 3 {
			continue
		}
		id, err := strconv.Atoi(f[2])
		if err != nil {
			continue
		}
		byName[f[0]], used[id] = id, true
	}
	return byName, used
}

func freeID(used map[int]bool, want int) int {
	for id := want; ; id++ {
		if !used[id] {
			return id
		}
	}
}

func addUser(root *unpack.Root, user string) error {
	passwd, err := readLines(root, "/etc/passwd")
	if err != nil {
		return fmt.Errorf("inject user: %w", err)
	}
	group, err := readLines(root, "/etc/group")
	if err != nil {
		return fmt.Errorf("inject user: %w", err)
	}
	shadow, err := readLines(root, "/etc/shadow")
	if err != nil {
		return fmt.Errorf("inject user: %w", err)
	}
	users, usedUIDs := ids(passwd)
	groups, usedGIDs := ids(group)
	if !hasName(passwd, "root") {
		passwd = append([]string{"root:x:0:0:root:/root:/bin/sh"}, passwd...)
		usedUIDs[0] = true
	}
	if !hasName(group, "root") {
		group = append([]string{"root:x:0:"}, group...)
		usedGIDs[0] = true
	}
	gid, ok := groups[user]
	if !ok {
		gid = freeID(usedGIDs, 1000)
		group = append(group, fmt.Sprintf("%s:x:%d:", user, gid))
	}
	uid, ok := users[user]
	home := "/home/" + user
	if !ok {
		uid = freeID(usedUIDs, 1000)
		shell := "/bin/sh"
		if root.IsRegular("/bin/bash") {
			shell = "/bin/bash"
		}
		passwd = append(passwd, fmt.Sprintf("%s:x:%d:%d::%s:%s", user, uid, gid, home, shell))
	} else {
		for _, l := range passwd {
			if f := strings.Split(l, ":"); len(f) >= 6 && f[0] == user && f[5] != "" {
				home = f[5]
			}
		}
	}
	if !hasName(shadow, "root") {
		shadow = append([]string{"root:*:19000:0:99999:7:::"}, shadow...)
	}
	if !hasName(shadow, user) {
		shadow = append(shadow, user+":!:19000:0:99999:7:::")
	}
	for _, f := range []struct {
		path  string
		lines []string
		perm  uint32
	}{{"/etc/passwd", passwd, 0o644}, {"/etc/group", group, 0o644}, {"/etc/shadow", shadow, 0o640}} {
		if err := root.WriteFile(f.path, []byte(strings.Join(f.lines, "\n")+"\n"), f.perm, 0, 0); err != nil {
			return fmt.Errorf("inject user: %w", err)
		}
	}
	if err := root.MkdirAll(home, 0o755, uid, gid); err != nil {
		return fmt.Errorf("inject user: %w", err)
	}
	return nil
}

func hasName(lines []string, name string) bool {
	for _, l := range lines {
		if strings.HasPrefix(l, name+":") {
			return true
		}
	}
	return false
}

// MakeExt4 makes an ext4 filesystem image at out from the tree with
// `mke2fs -d` (ownership, modes, xattrs, device nodes, hard and symbolic
// links and mtimes are copied) and returns its size in MiB; sizeMiB 0 sizes
// it from the tree's content.
func MakeExt4(ctx context.Context, tree, out string, sizeMiB int) (int, error) {
	plan, err := planExt4(tree, sizeMiB)
	if err != nil {
		return 0, err
	}
	return plan.sizeMiB, plan.make(ctx, tree, out, 0)
}

// ext4Plan is the filesystem mke2fs makes of a tree.
type ext4Plan struct {
	sizeMiB int
	inodes  int64
}

// planExt4 sizes the filesystem of tree: sizeMiB, or when 0 the tree's
// content + 25% + 64 MiB (+ 256 bytes an inode); inodes for every entry + 25%.
func planExt4(tree string, sizeMiB int) (ext4Plan, error) {
	var used, files int64
	err := filepath.WalkDir(tree, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		files++
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err == nil {
			used += st.Blocks * 512
		}
		return nil
	})
	if err != nil {
		return ext4Plan{}, fmt.Errorf("mke2fs: measure %s: %w", tree, err)
	}
	if sizeMiB <= 0 {
		sizeMiB = int((used+used/4)>>20) + 64 + int(files*256>>20)
	}
	return ext4Plan{sizeMiB: sizeMiB, inodes: max(files+files/4+4096, 16384)}, nil
}

// make runs mke2fs -d, writing the filesystem into the file out from byte
// offset off on (-E offset=).
func (p ext4Plan) make(ctx context.Context, tree, out string, off int64) error {
	ext := "root_owner=0:0"
	if off > 0 {
		ext += ",offset=" + strconv.FormatInt(off, 10)
	}
	args := []string{"-q", "-F", "-t", "ext4", "-L", "aenv-root", "-b", "4096", "-N", strconv.FormatInt(p.inodes, 10),
		"-E", ext, "-O", "^has_journal", "-d", tree, out, fmt.Sprintf("%dM", p.sizeMiB)}
	cmd := exec.CommandContext(ctx, "mke2fs", args...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("mke2fs -d %s %s (%d MiB, %d inodes): %w: %s", tree, out, p.sizeMiB, p.inodes, err, strings.TrimSpace(string(b)))
	}
	return nil
}
