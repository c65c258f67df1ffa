// Package memfs serves read-only memory images as files on a FUSE mount, so
// that every VM restored from one memory layer stack maps one file and the
// kernel's page cache holds its pages once, fetched only as guests touch
// them.
//
// One Server is one mount (one per storage daemon). Each export is a
// regular file in the mount's root, named by its export id, whose bytes are
// read from an io.ReaderAt (the layer-stack image the daemon opened). An
// export is reference counted (Add, Hold, Release) and can be added and
// removed while the mount serves others.
//
// # What an export guarantees, and why
//
//   - The bytes never change. A guest maps the file MAP_PRIVATE: its writes
//     land in its own anonymous pages, and every page it has not written is
//     the file's page in the page cache, shared with every other VM of the
//     stack. A page that changed under a mapping would change a running
//     guest's memory, so the file refuses every write(2), truncate and
//     attribute change (EPERM), and nothing invalidates its cached pages.
//     A refused write(2) must not touch the cache either: without
//     writeback caching the kernel copies the bytes into the cached page
//     before it asks the server, so each file carries an (empty)
//     security.capability attribute whose removal the kernel demands, and
//     the server refuses, before any byte is copied (capsXattr).
//   - Known limit: a writable MAP_SHARED mapping of a read-write descriptor
//     stores into the cached pages directly (the server only refuses the
//     writeback). QEMU with share=off never makes one; a VMM that could be
//     made to must be denied shared writable mappings by its confinement,
//     or open the file read-only (QEMU 8.2's readonly=on,rom=off).
//   - It opens read-write. QEMU 7.2's memory-backend-file opens its file
//     O_RDWR even with share=off, so the open must succeed; what makes the
//     file read-only is that no write is ever accepted. O_TRUNC opens are
//     refused.
//   - The page cache is kept across opens (FOPEN_KEEP_CACHE): a second VM,
//     or a restart of the first, maps pages already read without a FUSE
//     read. The mount does not let the kernel drop data on attribute changes
//     either (explicit cache control), since there are none.
//   - Never direct I/O: FOPEN_DIRECT_IO would bypass the page cache, which
//     is what makes a mapping shared.
//   - A read the source cannot serve is an I/O error (EIO; a fault on it is
//     SIGBUS in the VMM), never wrong or zero bytes.
//   - Private to the node: the mount is nosuid, nodev, noexec, with
//     default_permissions, files mode 0600 owned by the VMM's identity
//     (Options.UID/GID) and the root 0711 (reachable, not listable). The
//     kernel refuses processes of other uids than the mounter's unless the
//     mount allows others; that is asked for only when the VMM runs as
//     another uid than the daemon, and then the file modes keep everyone
//     but that uid (and root) out.
//   - Readahead: FUSE's readahead is bounded by the mount's bdi
//     read_ahead_kb (128 KiB by default); Serve raises it (ReadAheadKB) so
//     a cold fault reads around itself in one request, and reads up to
//     1 MiB are one FUSE request.
//   - Prefetch pushes ranges into the page cache with FUSE_NOTIFY_STORE, so
//     the faults a restore is known to take find their pages cached.
//
// The serving process must not map its own exports: a page fault on the
// mount blocks a thread outside a system call, and the Go runtime's
// stop-the-world then waits for that thread while the goroutines that
// would answer the fault wait for the world to start again. Plain read(2)
// and stat(2) are safe (a thread in a system call does not hold the world
// up); tests map the files from a child process.
//
// Close unmounts. A mount still in use (a VM maps a file) is detached
// lazily: its users keep it until they close it, and reads they take after
// the server is gone fail.
//
// # Surviving the serving process
//
// With Options.KeeperSocket the mount outlives its server, even a SIGKILL
// of it: a keeper process (keeper.go) holds the connection's /dev/fuse
// descriptor, and the next server's Open takes it over instead of
// mounting. The kernel notices nothing: requests wait in its queue while no
// server runs, and those the dead server had read but not answered are
// queued again (FUSE_NOTIFY_RESEND, protocol 7.40, kernel 6.9). For the new
// server to answer for what the kernel learned from the old one, nothing
// it hands out depends on the process: a node id is a hash of the export's
// name (names carry a nonce, never reused), every file handle is 0, and
// what INIT negotiated travels with the descriptor (ConnState). The caller
// adds its exports back between Open and Serve. The keeper is the
// serving program itself in a hidden mode: it must call RunKeeperIfAsked
// first thing in main (aenv-storaged does; test binaries in TestMain). A server that took over
// does not know the kernel's lookup counts, so it keeps a released
// export's node (serving it while its source lives) rather than forget it
// too early. Only the keeper and the server dying together ends the
// connection; either alone is survived (a live server starts a new keeper).
//
// The package speaks the FUSE protocol itself (proto.go, conn.go, raw.go):
// a library that waits for INIT cannot resume an initialised connection.
package memfs
