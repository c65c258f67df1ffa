// Package memsnap benchmarks memory layer capture and materialization
// (vmm/memsnap, memsnap_test.go) and the writing of layers into a process's
// mapping (overlay_test.go) against plain file copies of the same bytes
// measured in the same run. Run with:
//
//	go test -run '^$' -bench . -benchtime 1x ./bench/memsnap
package memsnap
