package sockdiag

// TCP states (include/net/tcp_states.h), as sock_diag reports them.
const (
	TCPEstablished = 1
	TCPSynSent     = 2
	TCPSynRecv     = 3
	TCPFinWait1    = 4
	TCPFinWait2    = 5
	TCPTimeWait    = 6
	TCPClose       = 7
	TCPCloseWait   = 8
	TCPLastAck     = 9
	TCPListen      = 10
	TCPClosing     = 11
)

// Unix socket states (SS_*), as sock_diag reports them.
const (
	UnixUnconnected   = 1
	UnixConnecting    = 2
	UnixConnected     = 3
	UnixDisconnecting = 4
)
