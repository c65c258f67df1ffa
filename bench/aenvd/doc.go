// Package aenvdbench measures sandbox creation through aenvd's API with real
// QEMU VMs: create latency split by stage (storage, network, VMM restore,
// agent init; each create's share of aenvd's own stage histograms), printed
// as medians over sequential creates, and create throughput with 10
// concurrent creates as a ratio to one at a time, in rounds (median and
// spread), in the same run; the create's median against the VMM's own
// restore (goal <= 1.5x); and, for this tree, the curve of 1, 2, 5, 10 and
// 20 creates at once (median latency, throughput against one at a time).
// BenchmarkCreatePool compares creates with the warm pool of VMM processes
// off and on (two nodes side by side, paired rounds), per stage and as
// ratios to the VMM's own restore; BenchmarkResumePool the same for the
// resume of a paused sandbox, each against the node's create.
// BenchmarkResizeMemory times the plug of 256 MiB back into a running
// sandbox (PATCH /sandboxes/{id}/memory) against the guest writing as much
// memory and a create, in the same run. Run them with `make bench` or
// `go test -run '^$' -bench . -benchtime 1x ./bench/aenvd`.
package aenvdbench
