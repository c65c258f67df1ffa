// Package proxybench measures the node's sandbox proxy (package proxy) on
// real network slots whose guests are namespaces: throughput of large
// answers and latency of small ones through the proxy, each as a ratio to
// the same client reaching the guest directly through its slot in the same
// run (the proxy's own dial, without the proxy's HTTP hop). Needs root.
//
//	go test -run '^$' -bench . -benchtime 1x ./bench/proxy/
package proxybench
