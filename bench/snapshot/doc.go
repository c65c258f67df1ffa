// Package snapshotbench benchmarks layered guest memory end to end on a real
// aenvd (api/aenvdtest, real QEMU VMs): how much host memory sandboxes
// restored from one snapshot share (PSS from /proc/<pid>/smaps_rollup),
// pause and resume time against the memory a guest dirtied (with a host cp
// of the same bytes as reference), and fork time for 1 vs 10 children
// against one plain create. Every ratio is against a reference measured in
// the same run; a benchmark fails only on functional errors. Run with:
//
//	go test -run '^$' -bench . -benchtime 1x -timeout 40m ./bench/snapshot/
package snapshotbench
