package qemu

// Tune sets what the restore torture test varies on d: the CPU model and
// extra TCG properties of the machines it boots (empty: the defaults) and
// whether restores map their memory file shared instead of private.
func Tune(d *Driver, cpu, tcg string, restoreShared bool) {
	d.tune = tuning{cpu: cpu, tcg: tcg, restoreShared: restoreShared}
}

// SparseCopy copies a memory image, leaving its holes holes.
func SparseCopy(src, dst string) (int64, error) { return sparseCopy(src, dst) }
