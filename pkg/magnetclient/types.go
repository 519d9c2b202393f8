// SPDX-License-Identifier: Apache-2.0

package magnetclient

// The types of the daemon's API (docs/DAEMON.md). The daemon encodes these
// very types, so a client and the daemon of one version always agree.

// Filter selects events and connections. Values of one field are
// alternatives; different fields must all match. The zero Filter matches
// everything the client may see.
type Filter struct {
	Types       []string `json:"types,omitempty"`  // event names; enables their groups
	Groups      []string `json:"groups,omitempty"` // event groups; enables them
	Conns       []uint64 `json:"conns,omitempty"`
	PIDs        []uint32 `json:"pids,omitempty"`  // owner of the connection, or task without one
	UIDs        []uint32 `json:"uids,omitempty"`  // the same, by uid
	Comms       []string `json:"comms,omitempty"` // the same, by command name
	Ports       []uint16 `json:"ports,omitempty"` // local or remote
	LocalPorts  []uint16 `json:"lports,omitempty"`
	RemotePorts []uint16 `json:"rports,omitempty"`
	Addrs       []string `json:"addrs,omitempty"` // addresses or prefixes, either end
	NetNS       []string `json:"netns,omitempty"` // inode numbers or names under /run/netns
	Protos      []string `json:"protos,omitempty"`
	Expr        string   `json:"expr,omitempty"` // CEL, see docs/DAEMON.md
	Pcap        string   `json:"pcap,omitempty"` // pcap-filter expression over the connection, see docs/FILTERS.md
}

// Status is GET /v1/status.
type Status struct {
	PID           int                  `json:"pid"`
	StartedWallNs int64                `json:"started_wall_ns"`
	Recording     bool                 `json:"recording"`
	Groups        GroupStatus          `json:"groups"`
	Recorder      RecorderStatus       `json:"recorder"`
	Connections   TableStatus          `json:"connections"`
	Subscribers   int                  `json:"subscribers"`
	Subscriptions []SubscriptionStatus `json:"subscriptions"`
	Client        ClientInfo           `json:"client"`
}

// GroupStatus says which event groups are loaded and enabled, and why.
type GroupStatus struct {
	Enabled   []string       `json:"enabled"`
	Baseline  []string       `json:"baseline"`
	Available []string       `json:"available"`
	Requested map[string]int `json:"requested"` // group → subscriptions asking for it
}

// RecorderStatus counts what the recorder delivered and what the kernel
// side lost because a ring was full.
type RecorderStatus struct {
	Events       uint64            `json:"events"`
	EventsByType map[string]uint64 `json:"events_by_type"`
	Lost         uint64            `json:"lost"`
	LostByType   map[string]uint64 `json:"lost_by_type"`
	// Missed counts the runs of the recorder's BPF programs the kernel
	// skipped (recursion protection: the program was already running on
	// that CPU): their events were never made, and Lost does not have them.
	Missed          uint64            `json:"missed"`
	MissedByProgram map[string]uint64 `json:"missed_by_program,omitempty"`
	// KernelSkipped counts the device program runs the kernel did not make
	// for frames the recorded interfaces counted (their own packet
	// counters; docs/EVENTS.md, Loss accounting): events missing that
	// neither Lost nor Missed has. Absent until the first comparison.
	KernelSkipped            *uint64           `json:"kernel_skipped,omitempty"`
	KernelSkippedByInterface []KernelSkipCount `json:"kernel_skipped_by_interface,omitempty"`
	BufferBytes              int               `json:"buffer_bytes"`
	// ProcessedNs is the time (CLOCK_MONOTONIC) up to which every event
	// has been handed to the subscriptions.
	ProcessedNs uint64 `json:"processed_ns"`
	// OutOfOrder counts the records that came after younger ones had
	// been handed on, and were handed on out of time order.
	OutOfOrder uint64 `json:"out_of_order"`
}

// KernelSkipCount is the device program runs the kernel did not make on
// one interface, for one program, since recording started: a counter.
type KernelSkipCount struct {
	NetNS     uint32 `json:"netns"`
	Ifindex   uint32 `json:"ifindex"`
	Interface string `json:"interface"`
	Program   string `json:"program"` // dev_xmit, dev_recv or dev_queue
	Skipped   uint64 `json:"skipped"`
}

// TableStatus describes the connection table.
type TableStatus struct {
	Tracked int    `json:"tracked"`
	Open    int    `json:"open"`
	Evicted uint64 `json:"evicted"`
	Max     int    `json:"max"`
}

// SubscriptionStatus is one live subscription.
type SubscriptionStatus struct {
	ID            uint64 `json:"id"`
	Kind          string `json:"kind"` // "events" or "figures"
	UID           uint32 `json:"uid"`
	PID           int32  `json:"pid"` // the client's process, 0 over TCP
	Filter        Filter `json:"filter"`
	Queue         int    `json:"queue"`
	Queued        int    `json:"queued"`
	Delivered     uint64 `json:"delivered"`
	Dropped       uint64 `json:"dropped"`
	StartedWallNs int64  `json:"started_wall_ns"`
}

// ClientInfo is who the daemon thinks the client is.
type ClientInfo struct {
	UID     uint32 `json:"uid"`
	SeesAll bool   `json:"sees_all"`
	Via     string `json:"via"` // "unix" or "tcp"
}

// ConnectionList is GET /v1/connections.
type ConnectionList struct {
	NowNs       uint64       `json:"now_ns"`
	Connections []Connection `json:"connections"`
}

// Connection is one connection and its figures at Window.NowNs.
type Connection struct {
	ID          uint64      `json:"id"`
	Proto       string      `json:"proto"`
	Local       string      `json:"local"`
	Remote      string      `json:"remote"`
	NetNS       uint32      `json:"netns"`
	Owner       *Owner      `json:"owner,omitempty"`
	OpenNs      uint64      `json:"open_ns"`
	CloseNs     uint64      `json:"close_ns"`
	LastNs      uint64      `json:"last_ns"`
	Events      uint64      `json:"events"`
	Window      Window      `json:"window"`
	App         Layer       `json:"app"`
	TCP         Layer       `json:"tcp"`
	Wire        Layer       `json:"wire"`
	State       *TCPState   `json:"tcp_state,omitempty"`
	Retransmits Retransmits `json:"retransmits"`
	Drops       Drops       `json:"drops"`
	SendBuffer  *SendBuffer `json:"send_buffer,omitempty"`
	Delivery    *Delivery   `json:"delivery,omitempty"`
}

// Owner is the process that owns a connection: the one whose system call
// announced it (connect, listen, bind), or, for an accepted connection,
// that of its first socket-layer event.
type Owner struct {
	PID  uint32 `json:"pid"`
	Comm string `json:"comm"`
	UID  int64  `json:"uid"` // real uid; -1 when unknown
}

// Window is what the rates of a Connection were computed over, and when.
type Window struct {
	Events int    `json:"events"` // the event window N (0: the daemon's default)
	Ns     int64  `json:"ns"`     // the time window T in ns (0: the daemon's default)
	NowNs  uint64 `json:"now_ns,omitempty"`
}

// Layer is a connection's traffic at one layer.
type Layer struct {
	Send Direction `json:"send"`
	Recv Direction `json:"recv"`
}

// Direction is one direction at one layer.
type Direction struct {
	Bytes      int64   `json:"bytes"`
	Events     uint64  `json:"events"`
	FirstNs    uint64  `json:"first_ns"`
	LastNs     uint64  `json:"last_ns"`
	AverageBPS float64 `json:"average_bps"`
	ByEvents   Rate    `json:"by_events"`
	ByTime     Rate    `json:"by_time"`
}

// Rate is a bandwidth over a window.
type Rate struct {
	BPS    float64 `json:"bps"`
	Bytes  int64   `json:"bytes"`
	Events int     `json:"events"`
	SpanNs int64   `json:"span_ns"`
}

// TCPState is a connection's last tcp_state snapshot, with the kernel's
// delivery-rate sample.
type TCPState struct {
	TimeNs             uint64  `json:"time_ns"`
	State              string  `json:"state"`
	CAState            string  `json:"ca_state"`
	Cwnd               uint32  `json:"cwnd"`
	Ssthresh           uint32  `json:"ssthresh"`
	SrttUs             uint32  `json:"srtt_us"`
	MSS                uint32  `json:"mss"`
	SndWnd             uint32  `json:"snd_wnd"`
	RcvWnd             uint32  `json:"rcv_wnd"`
	PacketsOut         uint32  `json:"packets_out"`
	RetransOut         uint32  `json:"retrans_out"`
	TotalRetrans       uint32  `json:"total_retrans"`
	Delivered          uint32  `json:"delivered"`
	Lost               uint32  `json:"lost"` // segments lost over the connection's life (the kernel's estimate)
	DeliveryRateBPS    float64 `json:"delivery_rate_bps"`
	DeliveryAppLimited bool    `json:"delivery_app_limited"`
}

// Delivery is the kernel's own delivery-rate estimate, from its per-ACK
// samples (tcp_rate events, the "rate" event group): what BBR and
// tcpi_delivery_rate use, to compare with the app and wire rates. Present
// once a tcp_rate event of the connection came.
type Delivery struct {
	Samples uint64         `json:"samples"` // tcp_rate events seen
	Last    DeliverySample `json:"last"`
	// Window is over the connection's time window (Window.Ns).
	Window DeliveryWindow `json:"window"`
}

// DeliverySample is one tcp_rate event: the sample the kernel kept after
// an ACK. BPS = RateDelivered × MSS × 8 / IntervalUs, as tcpi_delivery_rate.
type DeliverySample struct {
	AckNs         uint64  `json:"ack_ns"` // when the ACK was processed (CLOCK_MONOTONIC)
	BPS           float64 `json:"bps"`
	Delivered     uint32  `json:"delivered"` // segments over the connection's life
	Lost          uint32  `json:"lost"`
	RateDelivered uint32  `json:"rate_delivered"` // segments in the sample
	IntervalUs    uint32  `json:"interval_us"`
	MSS           uint32  `json:"mss"`
	AppLimited    bool    `json:"app_limited"`
	Repeat        bool    `json:"repeat"` // the kernel kept its previous sample
}

// DeliveryWindow sums the new samples of a time window. Samples the
// application limited say little about the network: they are only
// counted. MeanBPS weighs each sample by its interval (Σ bits / Σ
// intervals): a few short samples from ACK compression or a token-bucket
// burst, which can be ten times the link rate, do not swamp it; MaxBPS
// shows them (docs/DAEMON.md).
type DeliveryWindow struct {
	Ns         int64   `json:"ns"`
	Samples    int64   `json:"samples"` // not app-limited
	AppLimited int64   `json:"app_limited"`
	MaxBPS     float64 `json:"max_bps"`
	MeanBPS    float64 `json:"mean_bps"`
}

// Retransmits counts a connection's tcp_retrans events.
type Retransmits struct {
	Count     uint64  `json:"count"`
	Bytes     int64   `json:"bytes"`
	PerSecond float64 `json:"per_second"` // over the time window
}

// Drops counts the drop events attributed to a connection.
type Drops struct {
	Count     uint64            `json:"count"`
	PerSecond float64           `json:"per_second"` // over the time window
	ByReason  map[string]uint64 `json:"by_reason"`
}

// SendBuffer is the bytes written and not yet acknowledged.
type SendBuffer struct {
	Bytes    int64 `json:"bytes"`
	MaxBytes int64 `json:"max_bytes"`
}

// Bandwidth is GET /v1/connections/{id}/bandwidth.
type Bandwidth struct {
	Conn         uint64 `json:"conn"`
	Layer        string `json:"layer"`
	Dir          string `json:"dir"`
	WindowEvents int    `json:"window_events,omitempty"`
	WindowNs     int64  `json:"window_ns,omitempty"`
	Rate
	LastNs uint64 `json:"last_ns"`
	NowNs  uint64 `json:"now_ns"`
	// Delivery is the kernel's delivery-rate figures over the time window
	// (the daemon's default window when the rate is by events); present
	// when tcp_rate events of the connection came.
	Delivery *Delivery `json:"delivery,omitempty"`
}

// Message is one line of a stream: exactly one field is set.
type Message struct {
	Subscribed *Subscribed `json:"subscribed,omitempty"`
	Event      *Event      `json:"event,omitempty"`
	Lost       *Lost       `json:"lost,omitempty"`
	Figures    *Figures    `json:"figures,omitempty"`
	End        *End        `json:"end,omitempty"`
}

// Subscribed opens a stream: from here on, events are delivered.
type Subscribed struct {
	ID     uint64   `json:"id"`
	Kind   string   `json:"kind"`
	Groups []string `json:"groups"` // enabled once this subscription began
	Filter Filter   `json:"filter"`
	Queue  int      `json:"queue"`
}

// Event is one event. PID, TID and Comm are the task current when it
// happened; Owner is its connection's owner.
type Event struct {
	TimeNs   uint64 `json:"time_ns"`
	WallNs   int64  `json:"wall_ns"`
	Type     string `json:"type"`
	CPU      uint16 `json:"cpu"`
	PID      uint32 `json:"pid"`
	TID      uint32 `json:"tid"`
	Comm     string `json:"comm"`
	NetNS    uint32 `json:"netns"`
	Conn     uint64 `json:"conn"`
	Size     int32  `json:"size"`
	Flags    uint8  `json:"flags,omitempty"`
	TCPFlags string `json:"tcp_flags,omitempty"`
	Proto    string `json:"proto,omitempty"`
	Local    string `json:"local,omitempty"`
	Remote   string `json:"remote,omitempty"`
	Owner    *Owner `json:"owner,omitempty"`
	// Fields are the type's own fields (docs/EVENTS.md); numbers are
	// json.Number, exact for every u64.
	Fields map[string]any `json:"fields"`
}

// Lost says that events were lost: by this subscription (Source
// "subscriber": its queue was full) or by the recorder (Source "recorder":
// a kernel ring was full).
type Lost struct {
	Source  string            `json:"source"`
	Count   uint64            `json:"count"`
	Total   uint64            `json:"total,omitempty"` // subscriber: lost since the stream began
	ByType  map[string]uint64 `json:"by_type,omitempty"`
	CPU     *int              `json:"cpu,omitempty"`
	FirstNs uint64            `json:"first_ns,omitempty"`
	LastNs  uint64            `json:"last_ns,omitempty"`
}

// Figures is one push of a figure stream.
type Figures struct {
	NowNs       uint64       `json:"now_ns"`
	Connections []Connection `json:"connections"`
}

// End closes a stream.
type End struct {
	Reason  string `json:"reason"`
	Dropped uint64 `json:"dropped"`
}

// FlightTriggered answers POST /v1/flight/trigger: the flight recorder
// writes a file with the window before the call (its name comes once the
// file is done; Files lists those written before).
type FlightTriggered struct {
	Triggered bool     `json:"triggered"`
	Files     []string `json:"files"`
}

// ErrorBody is the body of every error answer.
type ErrorBody struct {
	Error string `json:"error"`
}

// Request is the JSON body of POST /v1/events and POST /v1/figures: a
// filter and the delivery options, in one object. Durations are Go
// durations as text ("100ms").
type Request struct {
	Filter
	Queue        int     `json:"queue,omitempty"`
	Every        string  `json:"every,omitempty"`  // figures
	Change       float64 `json:"change,omitempty"` // figures: percent
	Metric       string  `json:"metric,omitempty"` // figures
	WindowEvents int     `json:"window_events,omitempty"`
	Window       string  `json:"window,omitempty"`
	// Delivery (figures) asks for the kernel's per-ACK delivery-rate
	// figures: the daemon enables the rate group while the stream lasts.
	Delivery bool `json:"delivery,omitempty"`
}
