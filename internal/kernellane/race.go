//go:build race

package kernellane

// raceEnabled: this binary is built with the race detector.
const raceEnabled = true
