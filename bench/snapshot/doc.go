// Package snapshotbench benchmarks layered guest memory end to end on a real
// aenvd (api/aenvdtest, real QEMU VMs): how much host memory sandboxes
// restored from one snapshot share (PSS from /proc/<pid>/smaps_rollup),
// pause and resume time against the memory a guest dirtied (with a host cp
// of the same bytes as reference), and fork time for 1 vs 10 children
// against one plain create. Every ratio is against a reference measured in
// the same run; a benchmark fails only on functional errors. Run with:
//
//	go test -run '^$' -bench . -benchtime 1x -timeout 40m ./bench/snapshot/
//
// One aenvd serves the three benchmarks (network prefix snbench, ranges
// 10.95.0.0/16 and 10.96.0.0/16, guest RAM 512 MiB). Results go to stdout,
// one line per figure (b.Log would keep only ten). SNBENCH_THP_DISABLE=1
// runs aenvd and its VMMs without transparent huge pages (an experiment
// on where PSS goes).
package snapshotbench
