package memsnaptest

import "unsafe"

// unsafeAddr is the address of the first byte of a mapping.
func unsafeAddr(b []byte) unsafe.Pointer { return unsafe.Pointer(unsafe.SliceData(b)) }
