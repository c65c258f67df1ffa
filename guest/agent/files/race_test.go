//go:build race

package files_test

func init() { raceEnabled = true }
