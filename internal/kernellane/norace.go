//go:build !race

package kernellane

const raceEnabled = false
