// SPDX-License-Identifier: Apache-2.0

// Package conformance holds no code: its tests run real third-party
// programs (iperf3, nginx, curl, a Go net/http server) between network
// namespaces while the built magnet binary records them, and compare what
// magnet says with ground truth magnet did not compute: the applications'
// own byte counts, tcpdump captures of the same veth read back with tshark,
// nstat deltas of the namespaces, tc -s qdisc counters and TCP_INFO. Every
// device and drop figure has a third party too: bpftrace on the tracepoints
// magnet's device and drop programs use (internal/witness), over the same
// run, so that the frames the kernel ran no program of those tracepoints
// for are told apart from magnet's own misses, exactly.
//
// The tests need root, iproute2, iperf3, nginx, curl, tcpdump, tshark,
// nstat, bpftrace and bpftool (scripts/deps.sh installs them). Without root they skip; on CI
// (CI set) a missing tool fails them. What each figure is checked against,
// and why a relation is what it is, is in docs/EVENTS.md and
// docs/REPORT.md ("Checked against").
package conformance
