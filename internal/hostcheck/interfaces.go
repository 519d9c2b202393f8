// SPDX-License-Identifier: Apache-2.0

package hostcheck

import (
	"errors"
	"fmt"
	"net"
)

// Interface describes one network interface and what it does to per-packet
// timestamps. Each ethtool query that fails leaves its figure unset and
// says why in the matching *Error field, "unsupported by driver" when the
// driver does not implement it.
type Interface struct {
	Name  string `json:"name"`
	Index int    `json:"index"`
	MTU   int    `json:"mtu"`
	// Up is true when the interface is administratively up.
	Up       bool `json:"up"`
	Loopback bool `json:"loopback"`

	// SpeedMbps is the link speed in Mb/s, 0 when the driver does not
	// know it (no carrier, many virtual devices).
	SpeedMbps  int64  `json:"speed_mbps"`
	SpeedError string `json:"speed_error,omitempty"`

	// Offloads are the active offloads that merge or split packets.
	Offloads      *Offloads `json:"offloads,omitempty"`
	OffloadsError string    `json:"offloads_error,omitempty"`

	// Coalesce is the receive interrupt coalescing.
	Coalesce      *Coalesce `json:"coalesce,omitempty"`
	CoalesceError string    `json:"coalesce_error,omitempty"`
}

// Offloads are the active offloads of an interface that merge received
// packets into one (GRO, hardware GRO, LRO) or let the stack hand the
// device packets larger than the MTU (GSO, TSO).
type Offloads struct {
	// GRO is generic receive offload (rx-gro): the kernel merges packets
	// of one flow arriving in the same poll into one super-packet.
	GRO bool `json:"gro"`
	// GROHW is hardware GRO (rx-gro-hw): the NIC does the same.
	GROHW bool `json:"gro_hw"`
	// LRO is large receive offload (rx-lro): the NIC merges packets.
	LRO bool `json:"lro"`
	// GSO is generic segmentation offload (tx-generic-segmentation).
	GSO bool `json:"gso"`
	// TSO is TCP segmentation offload (tx-tcp-segmentation).
	TSO bool `json:"tso"`
}

// Merges reports whether any offload merges received packets.
func (o *Offloads) Merges() bool {
	return o != nil && (o.GRO || o.GROHW || o.LRO)
}

// Coalesce is the receive interrupt coalescing of an interface. A field the
// driver does not report is nil.
type Coalesce struct {
	// RxUsecs is how long, in µs, the NIC delays the interrupt after a
	// packet arrives (rx-usecs); 0 interrupts at once.
	RxUsecs *uint32 `json:"rx_usecs,omitempty"`
	// RxFrames is how many packets the NIC collects before it interrupts
	// (rx-frames); 0 or 1 interrupts at every packet.
	RxFrames *uint32 `json:"rx_frames,omitempty"`
	// AdaptiveRx is true when the driver changes RxUsecs with the load.
	AdaptiveRx *bool `json:"adaptive_rx,omitempty"`
}

// BlurNs returns for how long, in ns, packets arriving gapNs apart may wait
// for the same interrupt and so get the same timestamp: rx-usecs, or
// (rx-frames - 1) gaps, whichever ends the wait first; 0 when the NIC
// interrupts at once.
func (c *Coalesce) BlurNs(gapNs float64) float64 {
	if c == nil {
		return 0
	}
	var blur float64
	if c.RxUsecs != nil && *c.RxUsecs > 0 {
		blur = float64(*c.RxUsecs) * 1000
	}
	if c.RxFrames != nil && *c.RxFrames > 1 {
		frames := float64(*c.RxFrames-1) * gapNs
		if blur == 0 || frames < blur {
			blur = frames
		}
	}
	return blur
}

// Adaptive reports whether the driver adapts coalescing to the load.
func (c *Coalesce) Adaptive() bool {
	return c != nil && c.AdaptiveRx != nil && *c.AdaptiveRx
}

// listInterfaces lists the interfaces of the calling thread's network
// namespace with what ethtool netlink says about each. It uses rtnetlink
// rather than /sys/class/net, which shows the namespace sysfs was mounted
// in, not necessarily the thread's.
func listInterfaces() ([]Interface, string) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Sprintf("list interfaces: %v", err)
	}
	conn, dialErr := dialEthtool()
	if conn != nil {
		defer conn.Close()
	}
	out := make([]Interface, 0, len(ifs))
	for _, ni := range ifs {
		ifc := Interface{
			Name:     ni.Name,
			Index:    ni.Index,
			MTU:      ni.MTU,
			Up:       ni.Flags&net.FlagUp != 0,
			Loopback: ni.Flags&net.FlagLoopback != 0,
		}
		if dialErr != nil {
			msg := "ethtool netlink unavailable: " + dialErr.Error()
			ifc.SpeedError, ifc.OffloadsError, ifc.CoalesceError = msg, msg, msg
			out = append(out, ifc)
			continue
		}
		var err error
		if ifc.SpeedMbps, err = conn.linkSpeed(ni.Index); err != nil {
			ifc.SpeedError = queryError("link modes", err)
		}
		if ifc.Offloads, err = conn.offloads(ni.Index); err != nil {
			ifc.OffloadsError = queryError("features", err)
		}
		if ifc.Coalesce, err = conn.coalesce(ni.Index); err != nil {
			ifc.CoalesceError = queryError("coalescing", err)
		}
		out = append(out, ifc)
	}
	return out, ""
}

// queryError words a failed ethtool query for the report.
func queryError(what string, err error) string {
	if errors.Is(err, errUnsupported) {
		return errUnsupported.Error()
	}
	return fmt.Sprintf("ethtool %s: %v", what, err)
}
