package image

// Format features of the descriptors that lead outside the process: an
// older reader would restore such a descriptor as a new, unconnected
// object instead of refusing it.
const (
	// FeatureTCPRepair: a socket holds the TCP_REPAIR state of an
	// established connection (Socket.TCP).
	FeatureTCPRepair = "tcp-repair"
	// FeatureExternalFDs: a descriptor is a pipe or unix socket whose
	// other end was outside the process (FD.External).
	FeatureExternalFDs = "external-fds"
	// FeatureGhostFiles: a descriptor is a deleted file whose contents the
	// snapshot holds (FD.Ghost); an older reader would open its old path.
	FeatureGhostFiles = "ghost-files"
)

func init() {
	knownFeatures[FeatureTCPRepair] = true
	knownFeatures[FeatureExternalFDs] = true
	knownFeatures[FeatureGhostFiles] = true
}

// TCPConn is an established TCP connection as TCP_REPAIR shows it: what
// restore needs to put a new socket in the same place of the same
// connection without a handshake, the peer none the wiser.
type TCPConn struct {
	// SendSeq is the sequence number after the last byte of the send
	// queue (write_seq), RecvSeq the next one expected from the peer
	// (rcv_nxt).
	SendSeq uint32 `json:"send_seq"`
	RecvSeq uint32 `json:"recv_seq"`
	// SendQueue holds the bytes sent but not acknowledged, then the
	// Unsent bytes the kernel had not sent yet; RecvQueue the bytes
	// received that the program had not read.
	SendQueue []byte `json:"send_queue,omitempty"`
	Unsent    int    `json:"unsent,omitempty"`
	RecvQueue []byte `json:"recv_queue,omitempty"`
	// MSS is the mss clamp (TCP_MAXSEG); Options the TCPI_OPT_* bits
	// negotiated (timestamps 1, SACK 2, window scale 4) with the window
	// scales and the timestamp clock (TCP_TIMESTAMP).
	MSS       uint32 `json:"mss"`
	Options   uint8  `json:"options"`
	SndWscale uint8  `json:"snd_wscale,omitempty"`
	RcvWscale uint8  `json:"rcv_wscale,omitempty"`
	Timestamp uint32 `json:"timestamp,omitempty"`
	// SndBuf and RcvBuf are the socket's buffer sizes (SO_SNDBUF,
	// SO_RCVBUF as getsockopt reports them): restore makes them as large
	// again when the queued bytes need it.
	SndBuf int `json:"sndbuf,omitempty"`
	RcvBuf int `json:"rcvbuf,omitempty"`
	// Window is TCP_REPAIR_WINDOW's state, if the kernel gave it.
	Window *TCPWindow `json:"window,omitempty"`
	// Lock names the nftables table (family inet) that drops the
	// connection's packets from the dump until its restore, so that
	// neither side resets it meanwhile.
	Lock string `json:"lock,omitempty"`
}

// TCPWindow is struct tcp_repair_window.
type TCPWindow struct {
	SndWl1    uint32 `json:"snd_wl1"`
	SndWnd    uint32 `json:"snd_wnd"`
	MaxWindow uint32 `json:"max_window"`
	RcvWnd    uint32 `json:"rcv_wnd"`
	RcvWup    uint32 `json:"rcv_wup"`
}

// features lists the format features p's state needs.
func (p *Process) features() []string {
	var out []string
	tcp, ext, ghost := false, false, false
	for _, v := range p.VMAs {
		if v.Shmem != nil && v.Shmem.SysV != nil {
			out = append(out, FeatureSysVShm)
			break
		}
	}
	for _, v := range p.VMAs {
		ghost = ghost || v.Ghost != nil
	}
	for _, f := range p.FDs {
		tcp = tcp || f.Socket != nil && f.Socket.TCP != nil
		ext = ext || f.External != ""
		ghost = ghost || f.Ghost != nil
	}
	if ext {
		out = append(out, FeatureExternalFDs)
	}
	if ghost {
		out = append(out, FeatureGhostFiles)
	}
	if tcp {
		out = append(out, FeatureTCPRepair)
	}
	if p.SysVIPC != nil {
		out = append(out, FeatureSysVIPC)
	}
	for _, f := range p.FDs {
		if f.Pty != nil {
			out = append(out, FeaturePty)
			break
		}
	}
	return out
}
