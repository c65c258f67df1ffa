// Package composeproj is, for tests and benchmarks of compose sandboxes, a
// two-service Compose project over the small root's busybox
// (internal/testutil/smallroot): web serves a page; relay fetches it from
// web by its service name every second and serves what it got on a
// published port, so an answer through the node's proxy shows both
// services running and talking to each other.
package composeproj

import (
	"testing"

	"github.com/agentenv/agentenv/internal/testutil/smallroot"
)

// RelayPort is the port relay publishes.
const RelayPort = "8081"

// Push pushes the project's two images to the registry at host (web's page
// is page) and returns the project's Compose file.
func Push(t testing.TB, host, tag, page string) string {
	t.Helper()
	web := smallroot.Push(t, host, "compose/web:"+tag, map[string]string{"www/index.html": page})
	relay := smallroot.Push(t, host, "compose/relay:"+tag, nil)
	return File(web, relay)
}

// File is the project's Compose file for the images given.
func File(webImage, relayImage string) string {
	return `services:
  web:
    image: ` + webImage + `
    command: ["/bin/busybox", "httpd", "-f", "-p", "80", "-h", "/www"]
  relay:
    image: ` + relayImage + `
    depends_on: [web]
    ports: ["` + RelayPort + `:` + RelayPort + `"]
    command: ["/bin/sh", "-c", "mkdir -p /www; while true; do busybox wget -q -O /www/new http://web/ && mv /www/new /www/index.html; sleep 1; done & exec busybox httpd -f -p ` + RelayPort + ` -h /www"]
`
}
