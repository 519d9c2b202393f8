// SPDX-License-Identifier: Apache-2.0

package analyze

import "strings"

// notLost are the kernel's drop reasons (enum skb_drop_reason, without its
// SKB_DROP_REASON_ prefix) for packets that were never going to be
// delivered: a connection's queues freed as it ends, segments for a socket
// that is closing or gone, and duplicates of data or ACKs already taken.
// Freeing them loses nothing the application would have had. Every other
// reason is a drop that loses data (the sender must send it again, or it
// is gone).
var notLost = map[string]bool{
	// no reason given: kfree_skb() without one, which in TCP traces comes
	// with teardown (a socket's queues purged, a reset)
	"NOT_SPECIFIED": true,
	// teardown
	"QUEUE_PURGE":  true, // a socket's write or receive queue freed as it closes
	"SOCKET_CLOSE": true,
	"TCP_CLOSE":    true, // a segment for a socket already in CLOSE
	"NO_SOCKET":    true, // a segment for a connection already gone
	"TCP_RESET":    true,
	// duplicates: data or ACKs the receiver already has
	"TCP_OLD_DATA":     true,
	"TCP_OLD_SEQUENCE": true,
	"TCP_OLD_ACK":      true,
	"TCP_OFOMERGE":     true, // merged into data already queued out of order
	"TCP_RFC7323_PAWS": true, // an old duplicate by its timestamp
	"DUP_FRAG":         true,
}

// DropLosesData says whether a drop of this reason (as the trace names it)
// loses data, or is the kernel freeing a packet that was never going to be
// delivered: teardown, or a duplicate.
func DropLosesData(reason string) bool {
	return !notLost[strings.TrimPrefix(reason, "SKB_DROP_REASON_")]
}

// DropClasses splits drops by reason into those that lose data and those
// that do not.
type DropClasses struct {
	LoseData uint64 `json:"lose_data"`
	// Teardown counts packets freed at teardown or as duplicates.
	Teardown uint64 `json:"teardown_or_duplicate"`
}

func classifyDrops(by map[string]uint64) *DropClasses {
	if len(by) == 0 {
		return nil
	}
	var c DropClasses
	for reason, n := range by {
		if DropLosesData(reason) {
			c.LoseData += n
		} else {
			c.Teardown += n
		}
	}
	return &c
}
