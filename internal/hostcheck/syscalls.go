// SPDX-License-Identifier: Apache-2.0

package hostcheck

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// syscallBatch is how many getppid calls one timed batch makes.
	syscallBatch = 1000
	// sendBatch is how many datagrams one timed batch sends before the
	// receiver is drained. 16 datagrams of 1472 bytes fit in the default
	// socket receive buffer (net.core.rmem_default, 208 KiB), so every send
	// is delivered rather than dropped, as on a real path.
	sendBatch = 16
	// UDPPayloadBytes is the payload of the timed datagrams: a 1500-byte
	// IPv4 packet less 20 bytes of IP and 8 of UDP header.
	UDPPayloadBytes = PacketBytes - 20 - 8
)

// Syscalls holds the cost of entering the kernel and of sending a packet.
type Syscalls struct {
	// MinimalNs is the median cost of getppid, about the cheapest system
	// call there is: the bare price of entering and leaving the kernel.
	MinimalNs float64 `json:"minimal_ns"`
	// UDPSendNs is the median cost of one send of UDPSendBytes on a
	// connected UDP socket to 127.0.0.1, through the whole IP stack.
	UDPSendNs float64 `json:"udp_send_ns"`
	// UDPSendBytes is the payload size of the timed sends.
	UDPSendBytes int `json:"udp_send_bytes"`
	// UDPSendError says why the send cost could not be measured.
	UDPSendError string `json:"udp_send_error,omitempty"`
}

// measureSyscalls times getppid and UDP sends over loopback.
func measureSyscalls(s samples) Syscalls {
	sc := Syscalls{UDPSendBytes: UDPPayloadBytes}
	costs := make([]float64, s.syscallBatches)
	for i := range costs {
		t0 := time.Now()
		for range syscallBatch {
			unix.Syscall(unix.SYS_GETPPID, 0, 0, 0)
		}
		costs[i] = float64(time.Since(t0)) / syscallBatch
	}
	sc.MinimalNs = median(costs)

	send, err := measureUDPSend(s.sendBatches)
	if err != nil {
		sc.UDPSendError = err.Error()
	}
	sc.UDPSendNs = send
	return sc
}

// measureUDPSend returns the median cost in ns of sending one
// UDPPayloadBytes datagram to a socket of its own on 127.0.0.1. Nothing
// is ever sent to any other address.
func measureUDPSend(batches int) (float64, error) {
	loopback := &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}
	rx, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return 0, fmt.Errorf("open receiving socket: %w", err)
	}
	defer unix.Close(rx)
	if err := unix.Bind(rx, loopback); err != nil {
		return 0, fmt.Errorf("bind 127.0.0.1: %w", err)
	}
	bound, err := unix.Getsockname(rx)
	if err != nil {
		return 0, fmt.Errorf("find bound port: %w", err)
	}
	tx, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("open sending socket: %w", err)
	}
	defer unix.Close(tx)
	if err := unix.Connect(tx, bound); err != nil {
		return 0, fmt.Errorf("connect to 127.0.0.1: %w", err)
	}

	payload := make([]byte, UDPPayloadBytes)
	drainBuf := make([]byte, UDPPayloadBytes+1)
	send := func() error {
		for range sendBatch {
			if _, err := unix.Write(tx, payload); err != nil {
				return fmt.Errorf("send to 127.0.0.1: %w", err)
			}
		}
		return nil
	}
	drain := func() error {
		for {
			_, _, err := unix.Recvfrom(rx, drainBuf, 0)
			if errors.Is(err, unix.EAGAIN) {
				return nil
			}
			if err != nil && !errors.Is(err, unix.EINTR) {
				return fmt.Errorf("drain loopback socket: %w", err)
			}
		}
	}
	// One untimed batch warms caches and the route.
	if err := send(); err != nil {
		return 0, err
	}
	if err := drain(); err != nil {
		return 0, err
	}
	costs := make([]float64, batches)
	for i := range costs {
		t0 := time.Now()
		if err := send(); err != nil {
			return 0, err
		}
		costs[i] = float64(time.Since(t0)) / sendBatch
		if err := drain(); err != nil {
			return 0, err
		}
	}
	return median(costs), nil
}

// SendCost measures, in about a hundredth of a second, the median cost in
// nanoseconds of one UDPPayloadBytes send through the loopback IP stack of
// the calling thread's network namespace, the figure Limits.SendCostNs
// reports. A packet-train sender uses it to know the highest rate it can
// pace (see Limits.MaxPacedBitRate) without running the whole check.
func SendCost() (float64, error) {
	ns, err := measureUDPSend(quickSamples.sendBatches)
	if err != nil {
		return 0, fmt.Errorf("hostcheck: udp send cost: %w", err)
	}
	return ns, nil
}
