// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/pkg/magnetclient"
)

// TestDaemonSummary runs the daemon in summary mode (summary: 200ms) on a
// bulk transfer between two namespaces: its connection table, fed by the
// conn_summary records, ends with exactly the bytes the application wrote
// (client) and read (server), and a stream that asks for the summary group
// gets conn_summary records adding up to the same.
func TestDaemonSummary(t *testing.T) {
	needRoot(t)
	lab := netlab.ForTest(t, netlab.Options{})
	const port = 9471 // in the test's own namespaces
	d := startDaemon(t, false, fmt.Sprintf("summary: 200ms\nfilter: {port: %d}\n", port))
	c := d.Client(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := c.Subscribe(ctx, magnetclient.Filter{Groups: []string{"summary"}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	events := make(chan *magnetclient.Event, 1024)
	go func() {
		defer close(events)
		for {
			m, err := st.Next()
			if err != nil {
				return
			}
			if m.Event != nil {
				events <- m.Event
			}
		}
	}()

	f := startFlow(t, lab, port, 16384)
	id := findConn(t, c, f)
	waitFor(t, func() bool {
		cn, err := c.Connection(ctx, id, magnetclient.Window{})
		return err == nil && cn.App.Send.Bytes > 4<<20
	})
	f.Stop()
	sent, recvd := f.Sent.Load(), f.Received.Load()
	if sent != recvd || sent == 0 {
		t.Fatalf("the application wrote %d bytes and read %d", sent, recvd)
	}

	// The last intervals come within a few summary periods of the close.
	var client, server *magnetclient.Connection
	deadline := time.Now().Add(15 * time.Second)
	for {
		conns, err := c.Connections(ctx, magnetclient.Filter{Ports: []uint16{port}}, magnetclient.Window{})
		if err != nil {
			t.Fatal(err)
		}
		client, server = nil, nil
		for i := range conns {
			switch {
			case conns[i].Local == f.Local.String():
				client = &conns[i]
			case conns[i].Local == f.Remote.String() && conns[i].Remote == f.Local.String():
				server = &conns[i]
			}
		}
		if client != nil && server != nil && client.App.Send.Bytes == sent && server.App.Recv.Bytes == recvd {
			break
		}
		if time.Now().After(deadline) {
			b, _ := json.Marshal(conns)
			t.Fatalf("the daemon's connections do not add up to %d bytes sent and read: %s\n%s", sent, b, d.log.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	// TCP sent every byte once, and again each one it retransmitted.
	if client.TCP.Send.Bytes != sent+client.Retransmits.Bytes {
		t.Errorf("client: tcp sent %d bytes, app %d + %d retransmitted",
			client.TCP.Send.Bytes, sent, client.Retransmits.Bytes)
	}

	// The stream's conn_summary records of the client add up the same.
	var streamed int64
	for streamed != sent {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatalf("the stream ended at %d of %d bytes", streamed, sent)
			}
			if ev.Type != "conn_summary" {
				t.Fatalf("a %s event in a stream of the summary group", ev.Type)
			}
			if ev.Conn == id {
				n, err := ev.Fields["sock_send_bytes"].(json.Number).Int64()
				if err != nil {
					t.Fatalf("sock_send_bytes %v: %v", ev.Fields["sock_send_bytes"], err)
				}
				streamed += n
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("the stream's conn_summary records give %d of the %d bytes sent", streamed, sent)
		}
	}
}
