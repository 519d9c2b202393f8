// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"context"
	"crypto/subtle"
	"encoding/binary"
	"net"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/filter"
	"github.com/magnet-tracer/magnet/internal/live"
)

// identity is who a client is: from the Unix socket's peer credentials,
// or the TCP listener's token.
type identity struct {
	uid     uint32
	gids    []uint32 // primary and supplementary
	pid     int32
	seesAll bool
	via     string // "unix" or "tcp"
}

// canSee says whether the client may see an event (docs/DAEMON.md#access):
// everything for root and the see-all groups; otherwise the events of the
// connections its uid owns, and the scheduler events of its own tasks.
func (id identity) canSee(e *filter.Event) bool {
	if id.seesAll {
		return true
	}
	if e.Conn != 0 {
		return e.HasOwner && e.OwnerUID == int64(id.uid)
	}
	if e.Type >= event.SchedSwitch && e.Type <= event.SchedExit {
		return e.UID == int64(id.uid)
	}
	return false
}

// owns says whether the client may see a connection.
func (id identity) owns(c *live.Conn) bool {
	return id.seesAll || c.Owner != nil && c.Owner.UID == int64(id.uid)
}

type credKey struct{}

// peerCreds is http.Server.ConnContext: it reads who is at the other end
// of a Unix socket once per connection.
func peerCreds(ctx context.Context, c net.Conn) context.Context {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return context.WithValue(ctx, credKey{}, &identity{via: "tcp"})
	}
	id := &identity{via: "unix", uid: ^uint32(0)}
	raw, err := uc.SyscallConn()
	if err != nil {
		return context.WithValue(ctx, credKey{}, id)
	}
	_ = raw.Control(func(fd uintptr) {
		cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		if err != nil {
			return
		}
		id.uid, id.pid = cred.Uid, cred.Pid
		id.gids = append(peerGroups(int(fd)), cred.Gid)
	})
	return context.WithValue(ctx, credKey{}, id)
}

// peerGroups reads the peer's supplementary groups (SO_PEERGROUPS, Linux
// 4.13): a list of gids, whose length the kernel says when the buffer is
// too small.
func peerGroups(fd int) []uint32 {
	buf := make([]byte, 64*4)
	for range 2 {
		n := uint32(len(buf))
		_, _, errno := syscall.Syscall6(syscall.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_PEERGROUPS,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
		if errno == unix.ERANGE && int(n) > len(buf) && n <= 65536*4 {
			buf = make([]byte, n)
			continue
		}
		if errno != 0 {
			return nil
		}
		out := make([]uint32, 0, n/4)
		for i := 0; i+4 <= int(n); i += 4 {
			out = append(out, binary.NativeEndian.Uint32(buf[i:]))
		}
		return out
	}
	return nil
}

// who authenticates a request: the Unix peer with the current see-all
// groups, or the TCP client with the current token. It answers the
// request itself (401) and returns nil when the client may not talk.
func (d *Daemon) who(w http.ResponseWriter, r *http.Request) *identity {
	base, _ := r.Context().Value(credKey{}).(*identity)
	if base == nil {
		writeError(w, http.StatusUnauthorized, "unknown client")
		return nil
	}
	id := *base
	set := d.settings()
	switch id.via {
	case "unix":
		id.seesAll = id.uid == 0 || slices.ContainsFunc(id.gids, func(g uint32) bool { return slices.Contains(set.seeAllGIDs, g) })
	case "tcp":
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || set.token == "" || subtle.ConstantTimeCompare([]byte(strings.TrimSpace(tok)), []byte(set.token)) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="magnet"`)
			writeError(w, http.StatusUnauthorized, "the TCP listener needs Authorization: Bearer TOKEN (the daemon's token_file)")
			return nil
		}
		id.seesAll = true
	}
	return &id
}
