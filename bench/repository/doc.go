// Package repositorybench benchmarks lazy, verified reads of layers from the
// snapshot repository against references measured in the same run: a whole
// layer read through the verified block cache from a real S3 server
// (versitygw, its POSIX backend on a temporary directory) vs the same layer
// read from a local file; the bytes fetched vs the layer's size when reading
// a sparse working set; the latency of a first read (open plus one 4 KiB
// read) through a peer vs through the object store; and a restore's working
// set read after a prefetch of its recorded hint vs read on demand; a
// whole layer kept local (repo.FetchLayer, verified) vs one plain GET of
// the object into a file (BenchmarkFetchLayer); and,
// with three aenvd nodes sharing one bucket (BenchmarkResumeOnAnotherNode,
// root, boots VMs), a sandbox's resume on another node from the repository,
// its rootfs read lazily, and on a third that fetches every layer first, vs
// its resume on its own node from local layers, with the bytes fetched
// before the resume answered against the layers' bytes. Ratios are printed, nothing is asserted on
// time. Run with:
//
//	go test -run '^$' -bench . -benchtime 1x ./bench/repository/
//
// AENV_BENCH_LOGS=dir keeps the nodes' logs of BenchmarkResumeOnAnotherNode
// there. AENV_BENCH_LAYER_MIB sets the layer size (default 64). Without the
// versitygw binary (.ci/setup.d/60-versitygw.sh) the benchmarks skip.
package repositorybench
