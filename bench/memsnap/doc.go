// Package memsnap benchmarks memory layer capture and materialization
// (vmm/memsnap) against plain file copies of the same bytes measured in the
// same run; see memsnap_test.go. Run with:
//
//	go test -run '^$' -bench . -benchtime 1x ./bench/memsnap
package memsnap
