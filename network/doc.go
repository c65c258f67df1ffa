// Package network owns the per-sandbox network of a node: slots, egress
// policy and the warm pool of slots.
//
// A slot is one network namespace holding everything a VM needs on the host
// side:
//
//	host netns                         slot netns (<prefix>-<index>)
//	  <prefix>v<index>  10.12.x.y/31 ──veth──  eth0  10.12.x.y+1/31 (default route)
//	  route HostIP via the veth          tap0  169.254.0.22/30  ── VM eth0 169.254.0.21/30
//	                                     (fixed MACs: GatewayMAC on tap0, GuestMAC in the VM)
//	  nft table <prefix>:                 nft table <prefix>_slot:
//	    masquerade HostCIDR, VethCIDR      drop from tap0 unless from 169.254.0.21 (+ rp_filter)
//	    drop slot -> slot, slot -> host     DNAT HostIP -> 169.254.0.21 (from the host's veth end only)
//	    to the slot ranges: only sockets    SNAT 169.254.0.21 -> HostIP (guest egress)
//	      with the manager's mark           egress policy on forwarded packets from tap0
//	    forward into slots: answers only    DNS from the guest redirected to our resolver
//
// Only the manager's own sockets (Slot.DialGuest, Manager.DialContext) reach
// a slot: they carry Config.SocketMark, and the host's rules reject every
// other local packet towards the slot ranges and forward nothing into a
// slot but answers to its guest. docs/security.md lists every rule and its
// test.
//
// Every slot has the same guest view (IP, gateway and MAC), which is what a
// VM restored from a snapshot expects. The host reaches a guest port at
// HostIP:port; the guest's egress leaves with HostIP as source and is
// masqueraded by the host.
//
// Rules are installed with nftables through netlink (github.com/google/nftables):
// one batch per slot, no processes spawned, and a slot's rules disappear
// with its namespace, so teardown is dropping the namespace.
//
// Domain rules in the egress policy are enforced by a DNS-aware resolver
// served inside each slot (see dns.go): the guest's DNS traffic, whatever
// server it targets, is redirected to it; answers for allowed names add
// their addresses, with the record's TTL, to a kernel set that the egress
// rules accept. The data path stays in the kernel.
//
// Lifecycle: New (cleans leftovers, installs the host table, starts the
// warm-pool worker), Acquire (pooled slot or a new one), Slot.SetPolicy at
// any time, Release (out of use at once; scrubbed in the background, then
// back to the pool or destroyed above the high watermark), Shutdown (waits
// for the scrubs, destroys everything). Destroying a slot only drops
// its namespaces; the kernel dismantles the devices in batches.
//
// Everything is named with a configurable prefix so that a crashed process's
// leftovers can be found and removed at the next start (Cleanup), and so
// that tests never collide with a running node.
package network
