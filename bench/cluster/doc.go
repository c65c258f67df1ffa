// Package clusterbench measures the cluster's control and data paths, each
// against a reference taken in the same run: the gateway's proxying of
// sandbox traffic (throughput of large responses and latency of small ones)
// against a direct connection to the origin, with a bare TCP relay in the
// gateway's place as the least a hop costs, the scheduler's placement
// decisions per second against the Redis round trips they are made of, and
// a create through the gateway against the same create sent to the node
// directly (BenchmarkCreateThroughGateway: one aenvd node; it boots VMs, so
// it runs as root and under the VM lock like the other VM benchmarks).
//
//	go test -run '^$' -bench . -benchtime 1x ./bench/cluster/
package clusterbench
