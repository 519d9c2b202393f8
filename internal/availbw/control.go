// SPDX-License-Identifier: Apache-2.0

package availbw

import (
	"bufio"
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
)

// ProtocolVersion is the version of the control protocol. Client and
// server must speak the same one.
const ProtocolVersion = 1

// maxMessage bounds one control message (a JSON line), so that a peer
// cannot make the other buffer without end.
const maxMessage = 4096

// Control message types, in the order a session uses them.
const (
	msgHello     = "hello"     // client → server: version, client nonce
	msgChallenge = "challenge" // server → client: server nonce, limits, proof of the secret
	msgStart     = "start"     // client → server: proof of the secret, UDP port
	msgReady     = "ready"     // server → client: session id
	msgStream    = "stream"    // client → server: send this stream
	msgSent      = "sent"      // server → client: what was sent
	msgBye       = "bye"       // either way: the end, with the server's CPU time
	msgError     = "error"     // server → client: why the session ends
)

// message is one control message. Fields unused by a type stay empty.
type message struct {
	Type    string `json:"type"`
	Version int    `json:"version,omitempty"`
	Nonce   string `json:"nonce,omitempty"`
	MAC     string `json:"mac,omitempty"`
	// Auth is set in a challenge when the server requires a secret.
	Auth bool `json:"auth,omitempty"`
	// Port is the client's UDP port the probe packets go to.
	Port    int    `json:"port,omitempty"`
	Session uint64 `json:"session,omitempty"`
	// The server's limits and pacing ability, in a challenge.
	MaxRate       float64 `json:"max_rate_bps,omitempty"`
	MaxDurationNs int64   `json:"max_duration_ns,omitempty"`
	Pace          float64 `json:"pace_bps,omitempty"`
	PaceError     string  `json:"pace_error,omitempty"`
	// RealTime says the server sends its streams at real-time priority.
	RealTime bool `json:"realtime,omitempty"`

	Stream *StreamSpec `json:"stream,omitempty"`
	Report *SendReport `json:"report,omitempty"`
	// CPUSeconds is the server's CPU time for the session, in its bye.
	CPUSeconds float64 `json:"cpu_s,omitempty"`
	Error      string  `json:"error,omitempty"`
}

// errMessage wraps every malformed message.
var errMessage = errors.New("bad control message")

// decodeMessage parses and checks one control message.
func decodeMessage(line []byte) (message, error) {
	var m message
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return m, fmt.Errorf("%w: %v", errMessage, err)
	}
	if dec.More() {
		return m, fmt.Errorf("%w: trailing data", errMessage)
	}
	if err := m.check(); err != nil {
		return m, fmt.Errorf("%w: %v", errMessage, err)
	}
	return m, nil
}

// check rejects values no honest peer sends.
func (m message) check() error {
	switch m.Type {
	case msgHello, msgChallenge, msgStart, msgReady, msgStream, msgSent, msgBye, msgError:
	default:
		return fmt.Errorf("unknown type %q", m.Type)
	}
	if len(m.Nonce) > 64 || len(m.MAC) > 128 || len(m.Error) > 512 || len(m.PaceError) > 512 {
		return errors.New("oversized field")
	}
	for _, f := range []float64{m.MaxRate, m.Pace, m.CPUSeconds} {
		if f < 0 || math.IsNaN(f) || math.IsInf(f, 0) {
			return fmt.Errorf("bad number %v", f)
		}
	}
	if m.Port < 0 || m.Port > 65535 {
		return fmt.Errorf("port %d out of range", m.Port)
	}
	if m.MaxDurationNs < 0 {
		return errors.New("negative duration")
	}
	if m.Type == msgStream {
		if m.Stream == nil {
			return errors.New("stream request without a stream")
		}
		if err := m.Stream.check(); err != nil {
			return err
		}
	}
	if m.Type == msgSent && m.Report == nil {
		return errors.New("sent without a report")
	}
	if r := m.Report; r != nil && (r.Sent < 0 || r.Sent > MaxStreamPackets || len(r.Refused) > 512) {
		return errors.New("bad send report")
	}
	return nil
}

// check rejects a stream the server must not send.
func (s StreamSpec) check() error {
	switch {
	case s.Count < 1 || s.Count > MaxStreamPackets:
		return fmt.Errorf("stream of %d packets outside 1..%d", s.Count, MaxStreamPackets)
	case s.Size < MinPacketSize || s.Size > MaxPacketSize:
		return fmt.Errorf("packet size %d outside %d..%d", s.Size, MinPacketSize, MaxPacketSize)
	case s.GapNs <= 0 || s.GapNs > 1e9:
		return fmt.Errorf("gap %d ns outside 1 ns..1 s", s.GapNs)
	}
	return nil
}

// conn reads and writes control messages on a stream.
type conn struct {
	r *bufio.Reader
	w io.Writer
}

func newConn(rw io.ReadWriter) *conn {
	return &conn{r: bufio.NewReaderSize(rw, maxMessage), w: rw}
}

// read returns the next message.
func (c *conn) read() (message, error) {
	line, err := c.r.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		return message{}, fmt.Errorf("%w: longer than %d bytes", errMessage, maxMessage)
	}
	if err != nil {
		if errors.Is(err, io.EOF) && len(line) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return message{}, err
	}
	return decodeMessage(line)
}

// write sends m as one line.
func (c *conn) write(m message) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	_, err = c.w.Write(append(b, '\n'))
	return err
}

// expect reads a message and fails unless it has type want; an error
// message from the peer becomes the error.
func (c *conn) expect(want string) (message, error) {
	m, err := c.read()
	if err != nil {
		return m, err
	}
	if m.Type == msgError {
		return m, fmt.Errorf("server: %s", m.Error)
	}
	if m.Type != want {
		return m, fmt.Errorf("%w: got %q, want %q", errMessage, m.Type, want)
	}
	return m, nil
}

// newNonce returns 16 random bytes in hex.
func newNonce() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("random nonce: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// proof is the HMAC-SHA256, keyed with the shared secret, of the role and
// both nonces. Each side proves it knows the secret without sending it,
// and a proof cannot be replayed in another session (fresh nonces) or
// reflected to the other side (the role differs).
func proof(secret, role, clientNonce, serverNonce string) string {
	h := hmac.New(sha256.New, []byte(secret))
	fmt.Fprintf(h, "magnet-probe-v%d\x00%s\x00%s\x00%s", ProtocolVersion, role, clientNonce, serverNonce)
	return hex.EncodeToString(h.Sum(nil))
}

// validProof compares a received proof with the expected one in constant
// time.
func validProof(got, secret, role, clientNonce, serverNonce string) bool {
	want := proof(secret, role, clientNonce, serverNonce)
	return hmac.Equal([]byte(got), []byte(want))
}
