// SPDX-License-Identifier: Apache-2.0

package netlab

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
)

// ForTest builds a Lab for a test or benchmark and deletes it when the test
// ends. It skips the test, with the reason from Available, when labs cannot
// be built here, and fails it when setup goes wrong on a system that should
// support it.
func ForTest(tb testing.TB, opts Options) *Lab {
	tb.Helper()
	if err := Available(); err != nil {
		tb.Skip(err)
	}
	l, err := New(opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := l.Close(); err != nil {
			tb.Error(err)
		}
	})
	return l
}

// PathForTest builds a Path for a test or benchmark and deletes it when the
// test ends, skipping and failing as ForTest does.
func PathForTest(tb testing.TB, opts PathOptions) *Path {
	tb.Helper()
	if err := Available(); err != nil {
		tb.Skip(err)
	}
	p, err := NewPath(opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := p.Close(); err != nil {
			tb.Error(err)
		}
	})
	return p
}

// nginxConf keeps everything nginx writes in dir (%[1]s) and serves
// dir/www on the listen directive %[2]s, with the access log format %[3]s.
// One process (no master): the pid started is the pid that listens and
// serves.
const nginxConf = `daemon off;
master_process off;
worker_processes 1;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log;
events { worker_connections 64; }
http {
	%[3]s
	client_body_temp_path %[1]s/body;
	proxy_temp_path %[1]s/proxy;
	fastcgi_temp_path %[1]s/fastcgi;
	uwsgi_temp_path %[1]s/uwsgi;
	scgi_temp_path %[1]s/scgi;
	server {
		listen %[2]s;
		root %[1]s/www;
	}
}
`

// StartNginx runs an unmodified nginx (the binary at path) in h's
// namespace, serving dir/www (which the caller fills) on listen (an nginx
// listen directive's value, "ADDR:PORT" or "[::]:PORT ipv6only=off"),
// everything it writes kept in dir. Its access log, dir/access.log, is
// nginx's own count of the requests: logFormat, if not empty, is the
// format of its lines. It is stopped (SIGTERM) when the test ends; it may
// not listen yet when StartNginx returns.
func StartNginx(tb testing.TB, h Host, path, dir, listen, logFormat string, stderr io.Writer) *exec.Cmd {
	tb.Helper()
	if err := os.MkdirAll(filepath.Join(dir, "www"), 0o755); err != nil {
		tb.Fatal(err)
	}
	accessLog := "access_log " + dir + "/access.log;"
	if logFormat != "" {
		accessLog = "log_format custom " + strconv.Quote(logFormat) + ";\n\taccess_log " + dir + "/access.log custom;"
	}
	conf := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(nginxConf, dir, listen, accessLog)), 0o644); err != nil {
		tb.Fatal(err)
	}
	// nsenter execs nginx: the pid started is nginx's.
	srv := exec.Command("nsenter", "--net=/run/netns/"+h.NS, path, "-c", conf, "-e", filepath.Join(dir, "error.log"))
	srv.Stderr = stderr
	if err := srv.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if srv.ProcessState == nil {
			srv.Process.Signal(syscall.SIGTERM)
			srv.Wait()
		}
	})
	return srv
}
