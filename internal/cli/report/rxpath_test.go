// SPDX-License-Identifier: Apache-2.0

package report

import (
	"bytes"
	"strings"
	"testing"

	"github.com/magnet-tracer/magnet/internal/analyze"
)

// TestRxPathConnections: per connection, the text report says how many of
// its polls it shared with other connections and, when some, how many of
// its packets were in no poll, then where to list each poll's
// connections.
func TestRxPathConnections(t *testing.T) {
	rp := &analyze.RxPath{Trace: "rx.mgt", SpanS: 1, All: &analyze.RxCPU{CPU: -1}, Conns: []*analyze.RxConn{
		{Conn: 7, Packets: 3, Polls: 2, PerPoll: 1.5, SharedPolls: 1, OutsidePolls: 1},
		{Conn: 9, Packets: 2, Polls: 2, PerPoll: 1},
	}}
	var b bytes.Buffer
	writeRxPath(&b, rp)
	want := "  connection 7: 3 packets in 2 polls (1.5 a poll), 1 of the polls shared with other connections; 1 packets in no poll\n" +
		"  connection 9: 2 packets in 2 polls (1.0 a poll), 0 of the polls shared with other connections\n" +
		"  each poll's connections: magnet export rx.mgt --table polls -f csv -o polls.csv\n"
	if !strings.HasSuffix(b.String(), want) {
		t.Errorf("report:\n%s\nwant it to end:\n%s", b.String(), want)
	}
}

// TestRxPathConnectionsHTML: the HTML page has the same per-connection
// figures and the pointer to --table polls.
func TestRxPathConnectionsHTML(t *testing.T) {
	rp := &analyze.RxPath{Trace: "rx.mgt", SpanS: 1, All: &analyze.RxCPU{CPU: -1}, Conns: []*analyze.RxConn{
		{Conn: 7, Packets: 3, Polls: 2, PerPoll: 1.5, SharedPolls: 1, OutsidePolls: 1},
	}}
	var b bytes.Buffer
	if err := page.Execute(&b, struct {
		Rep     *analyze.Report
		Plots   []string
		Made    string
		Summary func(*analyze.ConnReport) string
	}{Rep: &analyze.Report{ReceivePath: []*analyze.RxPath{rp}}, Summary: summaryLine}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"<tr><td>7</td><td>3</td><td>2</td><td>1.5</td><td>1</td><td>1</td></tr>",
		"<code>magnet export rx.mgt --table polls -f csv -o polls.csv</code>",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the page has no %q", want)
		}
	}
}
