// SPDX-License-Identifier: Apache-2.0

package conformance_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/magnet-tracer/magnet/internal/netlab"
)

// fileSize is the body each HTTP scenario serves.
const fileSize = 20 << 20

// TestNginxCurl serves a 20 MiB file with nginx to curl over the lab's
// 100 Mbit/s link, with the listen directives people write: "[::]:PORT"
// (IPv6 only, nginx's default for it) to an IPv6 client, "[::]:PORT
// ipv6only=off" (one dual-stack socket) to an IPv4 client, and "PORT"
// (IPv4) to an IPv4 client. The ground truth is curl's size_download,
// size_header and size_request, nginx's $bytes_sent and $request_length,
// tshark on the server's veth and nstat.
func TestNginxCurl(t *testing.T) {
	need(t, "nginx", "curl", "ss", "nsenter")
	for i, sc := range []struct {
		name   string
		listen func(p int) string
		url    func(*netlab.Lab, int) string
		mss    int64
	}{
		{"listen_ipv6", func(p int) string { return fmt.Sprintf("[::]:%d", p) },
			func(_ *netlab.Lab, p int) string { return fmt.Sprintf("http://[%s]:%d/big", server6, p) }, 1428},
		{"listen_ipv6_dual_stack_ipv4_client", func(p int) string { return fmt.Sprintf("[::]:%d ipv6only=off", p) },
			func(l *netlab.Lab, p int) string { return fmt.Sprintf("http://%s:%d/big", l.Server.Addr, p) }, 1448},
		{"listen_port", func(p int) string { return strconv.Itoa(p) },
			func(l *netlab.Lab, p int) string { return fmt.Sprintf("http://%s:%d/big", l.Server.Addr, p) }, 1448},
	} {
		t.Run(sc.name, func(t *testing.T) {
			lab := newLab(t, "mgconfn", 100)
			p := port(5 + i)
			dir := t.TempDir()
			// nginx's access log: its own count of each request.
			var se bytes.Buffer
			srv := netlab.StartNginx(t, lab.Server, "nginx", dir, sc.listen(p), "$bytes_sent $body_bytes_sent $request_length", &se)
			if err := os.WriteFile(filepath.Join(dir, "www", "big"), bytes.Repeat([]byte("magnet\n"), fileSize/7+1)[:fileSize], 0o644); err != nil {
				t.Fatal(err)
			}
			waitListening(t, lab.Server, p, "tcp")

			nsC0, nsS0 := nstat(t, lab.Client), nstat(t, lab.Server)
			_, _, drops0 := qdiscStats(t, lab.Server)
			capS := startCapture(t, lab.Server, "tcp port "+strconv.Itoa(p))
			wit := startWitness(t, lab, p)
			rec := record(t, append(everyFrame, "--port", strconv.Itoa(p))...)
			out, err := exec.Command("ip", "netns", "exec", lab.Client.NS, "curl", "-sS", "-g", "-o", "/dev/null",
				"-w", "%{http_code} %{size_download} %{size_header} %{size_request}", sc.url(lab, p)).Output()
			if err != nil {
				t.Fatalf("curl: %v %s\nnginx: %s", err, out, se.String())
			}
			var code, download, header, request int64
			if _, err := fmt.Sscan(string(out), &code, &download, &header, &request); err != nil || code != 200 || download != fileSize {
				t.Fatalf("curl: %q (%v), want 200 and %d bytes", out, err, fileSize)
			}
			settled(t, lab, p)
			frames := capS.stop(t)
			tr := rec.stop(t)
			seen := wit.Stop(t)
			dC, dS := delta(nsC0, nstat(t, lab.Client)), delta(nsS0, nstat(t, lab.Server))
			_, _, drops1 := qdiscStats(t, lab.Server)
			stopProc(srv)
			logged, err := os.ReadFile(filepath.Join(dir, "access.log"))
			var bytesSent, bodySent, requestLen int64
			if err != nil || func() error { _, err := fmt.Sscan(string(logged), &bytesSent, &bodySent, &requestLen); return err }() != nil {
				t.Fatalf("nginx access log %q: %v", logged, err)
			}
			if bodySent != download || requestLen != request {
				t.Fatalf("nginx sent a body of %d bytes and read a request of %d; curl got %d and sent %d: no ground truth", bodySent, requestLen, download, request)
			}
			c := tcpCheck{
				lab: lab, port: p, tr: tr, frames: frames, nsClient: dC, nsServer: dS, mss: sc.mss,
				sent: bytesSent, received: download + header, total: download + header,
				appRetrans: -1, serverPID: srv.Process.Pid, serverComm: "nginx", download: true,
				qdiscDrops: int64(drops1 - drops0), seen: seen,
			}
			checkTCPTransfer(t, c)
			// The request, the other way: curl's size_request is nginx's
			// $request_length.
			check(t, "request_bytes_equal_app_counts", func(t testing.TB) {
				cli, srv := c.bulk(t)
				if cli.Sent != request || srv.Recv != requestLen {
					t.Errorf("client's sock_send %d bytes, curl sent %d; server's sock_recv %d, nginx read %d", cli.Sent, request, srv.Recv, requestLen)
				}
			})
		})
	}
}

// countingConn counts what the Go server writes to each connection: the
// application's own count.
type countingConn struct {
	net.Conn
	written *int64
}

func (c countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	*c.written += int64(n)
	return n, err
}

type countingListener struct {
	net.Listener
	written chan *int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	n := new(int64)
	l.written <- n
	return countingConn{c, n}, nil
}

// TestGoHTTP serves 20 MiB from a Go net/http server listening on ":PORT"
// (Go's dual-stack socket) in the server namespace, to a client written
// here (TestGoHTTPClient, in a process of its own) that connects over
// IPv4, reads the response to the end, closes, and reads TCP_INFO once its
// socket has reached TCP_CLOSE: the kernel's own figures at the moment
// magnet's conn_close is written.
func TestGoHTTP(t *testing.T) {
	need(t, "ss")
	lab := newLab(t, "mgconfg", 100)
	p := port(3)
	body := bytes.Repeat([]byte("magnet\n"), fileSize/7+1)[:fileSize]
	var ln net.Listener
	if err := lab.Server.Do(func() (err error) {
		ln, err = net.Listen("tcp", ":"+strconv.Itoa(p))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	cl := countingListener{ln, make(chan *int64, 4)}
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.Write(body)
	})}
	go hs.Serve(cl)
	t.Cleanup(func() { hs.Close() })

	nsC0, nsS0 := nstat(t, lab.Client), nstat(t, lab.Server)
	_, _, drops0 := qdiscStats(t, lab.Server)
	capS := startCapture(t, lab.Server, "tcp port "+strconv.Itoa(p))
	wit := startWitness(t, lab, p)
	rec := record(t, append(everyFrame, "--port", strconv.Itoa(p))...)

	// The client is this test binary run again in the client's namespace
	// (TestGoHTTPClient), so that the listener's owner is a question with
	// one right answer: this process, not the client's.
	cmd := exec.Command("nsenter", "--net=/run/netns/"+lab.Client.NS, os.Args[0], "-test.run=^TestGoHTTPClient$")
	cmd.Env = append(os.Environ(), clientEnv+"="+netip.AddrPortFrom(lab.Server.Addr, uint16(p)).String())
	var cse bytes.Buffer
	cmd.Stderr = &cse
	out, err := cmd.Output()
	var res clientResult
	if err != nil || json.Unmarshal(bytes.TrimSpace(bytes.SplitN(out, []byte("\n"), 2)[0]), &res) != nil || res.Error != "" {
		t.Fatalf("client: %v %s\n%s%s", err, res.Error, out, cse.String())
	}
	if res.Body != fileSize {
		t.Fatalf("the client read a body of %d bytes, want %d", res.Body, fileSize)
	}
	info := res.Info
	written := *<-cl.written
	settled(t, lab, p)
	frames := capS.stop(t)
	tr := rec.stop(t)
	seen := wit.Stop(t)
	dC, dS := delta(nsC0, nstat(t, lab.Client)), delta(nsS0, nstat(t, lab.Server))
	_, _, drops1 := qdiscStats(t, lab.Server)
	comm, _ := os.ReadFile("/proc/self/comm")

	c := tcpCheck{
		lab: lab, port: p, tr: tr, frames: frames, nsClient: dC, nsServer: dS, mss: 1448,
		sent: written, received: res.Read, total: res.Read,
		appRetrans: -1, serverPID: os.Getpid(), serverComm: strings.TrimSpace(string(comm)), download: true,
		qdiscDrops: int64(drops1 - drops0), seen: seen,
	}
	checkTCPTransfer(t, c)

	// TCP_INFO read on the closed socket is what conn_close recorded:
	// the same tcp_sock, no longer changing.
	check(t, "conn_close_equals_tcp_info", func(t testing.TB) {
		cli, _ := c.bulk(t)
		e, ok := tr.closeOf(cli.ID)
		if !ok {
			t.Fatalf("no conn_close for the client %d", cli.ID)
		}
		if e.BytesAcked != info.Bytes_acked || e.BytesReceived != info.Bytes_received || e.TotalRetrans != uint64(info.Total_retrans) {
			t.Errorf("conn_close: bytes_acked %d, bytes_received %d, total_retrans %d; TCP_INFO: %d, %d, %d",
				e.BytesAcked, e.BytesReceived, e.TotalRetrans, info.Bytes_acked, info.Bytes_received, info.Total_retrans)
		}
		// The bytes: the request and its FIN acknowledged, the response and
		// the server's FIN received, the SYN-ACK's acknowledgment of the SYN.
		if info.Bytes_received != uint64(res.Read)+1 || info.Bytes_acked != uint64(res.Wrote)+2 {
			t.Errorf("TCP_INFO bytes_received %d, bytes_acked %d; the client read %d bytes and wrote %d", info.Bytes_received, info.Bytes_acked, res.Read, res.Wrote)
		}
		// The last tcp_state, written as the socket closes, carries
		// tcpi_delivered (segments delivered, the SYN and FIN included).
		var last ev
		for _, x := range tr.events {
			if x.Event == "tcp_state" && x.Conn == cli.ID && x.Time >= last.Time {
				last = x
			}
		}
		if last.Event == "" || last.Delivered != uint64(info.Delivered) {
			t.Errorf("the client's last tcp_state delivered %d; TCP_INFO tcpi_delivered %d", last.Delivered, info.Delivered)
		}
	})
}

func tcpInfo(c *net.TCPConn) (*unix.TCPInfo, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var info *unix.TCPInfo
	var serr error
	if err := rc.Control(func(fd uintptr) {
		info, serr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); err != nil || serr != nil {
		return nil, errors.Join(err, serr)
	}
	return info, nil
}

// clientEnv names the server's address for TestGoHTTPClient; without it
// that test is not a client and skips.
const clientEnv = "MAGNET_CONFORMANCE_HTTP_CLIENT"

// clientResult is what TestGoHTTPClient prints, one JSON line.
type clientResult struct {
	Wrote, Read, Body int64
	Info              unix.TCPInfo
	Error             string
}

// TestGoHTTPClient is TestGoHTTP's client, run by it in the client's
// namespace: it asks for /big, reads the response to the end, closes its
// side, and prints TCP_INFO read once the socket is in TCP_CLOSE.
func TestGoHTTPClient(t *testing.T) {
	addr := os.Getenv(clientEnv)
	if addr == "" {
		t.Skip("TestGoHTTP's client process, run by it")
	}
	var res clientResult
	err := func() error {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return err
		}
		conn := c.(*net.TCPConn)
		defer conn.Close()
		req := "GET /big HTTP/1.1\r\nHost: magnet\r\nConnection: close\r\n\r\n"
		if _, err := io.WriteString(conn, req); err != nil {
			return err
		}
		res.Wrote = int64(len(req))
		resp, err := io.ReadAll(conn)
		if err != nil {
			return err
		}
		res.Read = int64(len(resp))
		head, body, ok := bytes.Cut(resp, []byte("\r\n\r\n"))
		if !ok || !bytes.HasPrefix(head, []byte("HTTP/1.1 200")) {
			return fmt.Errorf("response head %q", head[:min(len(head), 200)])
		}
		res.Body = int64(len(body))
		// The server closed first (Connection: close); closing ours
		// sends the last FIN, and its ACK takes the socket to TCP_CLOSE.
		// The state is polled: no event says when that ACK is processed.
		if err := conn.CloseWrite(); err != nil {
			return err
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			info, err := tcpInfo(conn)
			if err != nil {
				return err
			}
			if info.State == 7 /* TCP_CLOSE */ {
				res.Info = *info
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("the socket is in state %d after 10 s, not CLOSE", info.State)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	if err != nil {
		res.Error = err.Error()
	}
	b, _ := json.Marshal(res)
	os.Stdout.Write(append(b, '\n'))
}
