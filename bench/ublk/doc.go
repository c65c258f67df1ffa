// Package ublkbench measures, inside the kernel lane, ublk devices
// (storage/ublk) against the kernel NBD driver on our NBD server and a loop
// device on the flattened file, all serving the same image in the same run:
// fio 4 KiB random reads at queue depth 1 and 32 and 1 MiB sequential
// reads, printed as ratios, and the time from create to a ready device for
// ublk and NBD.
//
//	flock /tmp/aenv-vm.lock go test -run '^$' -bench . -benchtime 1x ./bench/ublk/
//
// Under TCG the absolute numbers say little; the ratios within one run are
// what to read.
package ublkbench
