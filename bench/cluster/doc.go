// Package clusterbench measures the cluster's control and data paths, each
// against a reference taken in the same run: the gateway's proxying of
// sandbox traffic (throughput of large responses and latency of small ones)
// against a direct connection to the origin, with a bare TCP relay in the
// gateway's place as the least a hop costs, and the scheduler's placement
// decisions per second against the Redis round trips they are made of.
//
//	go test -run '^$' -bench . -benchtime 1x ./bench/cluster/
package clusterbench
