// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/netlab"
)

// magnetBin is the magnet binary, built for the tests that need root: the
// workloads run as processes of their own (the recorder never traces its
// own process), and one test runs the daemon as a user would.
var magnetBin string

// testBin is a copy of this test binary any user can run, for the test
// whose client runs as an unprivileged user.
var testBin string

// helperEnv makes this test binary act as a client (userClient) instead of
// running tests.
const helperEnv = "MAGNET_DAEMON_TEST_CLIENT"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(userClient())
	}
	if os.Getenv(orderEnv) != "" {
		os.Exit(orderClient())
	}
	if os.Getenv(requestsEnv) != "" {
		os.Exit(requestClient())
	}
	code := func() int {
		if os.Geteuid() == 0 {
			netlab.CleanupStale("magnetd")
			dir, err := os.MkdirTemp("", "magnetd-test-bin-")
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			defer os.RemoveAll(dir)
			os.Chmod(dir, 0o755)
			magnetBin = filepath.Join(dir, "magnet")
			out, err := exec.Command("go", "build", "-o", magnetBin, "../../cmd/magnet").CombinedOutput()
			if err != nil {
				fmt.Fprintf(os.Stderr, "build magnet: %v\n%s", err, out)
				return 1
			}
			testBin = filepath.Join(dir, "daemon.test")
			if out, err := exec.Command("cp", os.Args[0], testBin).CombinedOutput(); err != nil {
				fmt.Fprintf(os.Stderr, "copy test binary: %v\n%s", err, out)
				return 1
			}
			os.Chmod(testBin, 0o755)
		}
		before := runtime.NumGoroutine()
		code := m.Run()
		// The fuzzing engine keeps a signal goroutine of its own.
		if f := flag.Lookup("test.fuzz"); code == 0 && (f == nil || f.Value.String() == "") {
			// Every daemon, stream and client a test started must be gone.
			deadline := time.Now().Add(5 * time.Second)
			for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			if n := runtime.NumGoroutine(); n > before {
				buf := make([]byte, 1<<20)
				buf = buf[:runtime.Stack(buf, true)]
				fmt.Fprintf(os.Stderr, "goroutines leaked: %d before the tests, %d after\n%s", before, n, buf)
				return 1
			}
		}
		return code
	}()
	os.Exit(code)
}
