// SPDX-License-Identifier: Apache-2.0

// Package availbw estimates the available bandwidth of a network path by
// packet trains (`magnet probe`, docs/PROBE.md): the rate the path could
// carry on top of its cross traffic. Server paces UDP streams at the
// rates a client asks for, within guards (rate, duration, secret); Client
// timestamps their arrival in the kernel, judges each stream's one-way
// delay trend, votes per fleet and searches the rate (pathload's method,
// with a fluid-model jump), and flags when the measuring host rather than
// the path limits the answer. The control messages are in control.go and
// the probe packets in packet.go; FuzzDecodeMessage fuzzes their decoder.
package availbw
