// Package aenvdbench measures sandbox creation through aenvd's API with real
// QEMU VMs: create latency split by stage (storage, network, VMM restore,
// agent init; from aenvd's own stage histograms) and create throughput with
// 10 concurrent creates as a ratio to one at a time, in the same run. Run it
// with `make bench` or `go test -run '^$' -bench . -benchtime 1x ./bench/aenvd`.
package aenvdbench
