// Package e2e runs the whole cluster on one machine with real processes:
// redis-server, two aenv-scheduler replicas, one aenv-gateway and three
// aenvd nodes booting QEMU VMs (separate data directories, network
// prefixes, address ranges and ports), and drives it through the gateway
// with E2B's npm SDK and plain HTTP: creates land on every node, commands
// run, files move, lists aggregate and paginate, pause and resume; a
// scheduler killed with SIGKILL, a Redis restart and a drained node do not
// stop routing. TestPartition cuts one live node off from the schedulers
// for a minute while its paused sandbox moves, and checks nothing is
// served twice, committed over or lost.
package e2e
