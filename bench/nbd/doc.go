// Package nbdbench benchmarks AgentENV's NBD export of a stacked LSMT image
// against qemu-nbd serving a qcow2 chain with the same layers and content, and
// qemu-nbd serving the flattened raw file, all driven by fio's nbd engine in
// the same run. Run it with `make bench` or
// `go test -run '^$' -bench . -benchtime 1x ./bench/nbd`.
package nbdbench
