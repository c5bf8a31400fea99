package image

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Process is the state of one dumped process, stored as
// process-PID.json. Addresses and masks are plain numbers; binary blobs
// (XSTATE, pipe contents) are base64 (encoding/json's []byte).
type Process struct {
	PID int `json:"pid"`
	// NSPID is set when the process lived in a pid namespace below the
	// dumper's: its pid in each namespace from the dumper's down (PID
	// first, its own view last: OwnPID). PPID, PGID, SID and the threads'
	// TID are the dumper's view. Such a snapshot has FeaturePIDNS and
	// restores into a new pid namespace only.
	NSPID []int `json:"ns_pid,omitempty"`
	// Namespaces names the namespaces besides the pid one in which the
	// process lived that were not the dumper's: "cgroup", "ipc", "mnt",
	// "net", "uts" (a container's). Such a snapshot has
	// FeatureNamespaces: its paths are its mount namespace's (a restore
	// looks its files up in snapctl's unless told --into, and says so
	// when they do not match), its sockets its network namespace's.
	Namespaces []string `json:"namespaces,omitempty"`
	// Cgroups is /proc/PID/cgroup at the dump, as the dumper saw it: a
	// record for people and tools (snapctl inspect); a restore joins the
	// cgroups of the process it restores into, not these.
	Cgroups     []string `json:"cgroups,omitempty"`
	PPID        int      `json:"ppid"`
	PGID        int      `json:"pgid"`
	SID         int      `json:"sid"`
	Comm        string   `json:"comm"`
	Cmdline     []string `json:"cmdline,omitempty"`
	Exe         FileID   `json:"exe"`
	Cwd         string   `json:"cwd"`
	Root        string   `json:"root"`
	Umask       uint32   `json:"umask"`
	Personality uint64   `json:"personality"`
	// Dumpable is prctl(PR_GET_DUMPABLE); restore sets it back.
	Dumpable int `json:"dumpable"`
	// ChildSubreaper is prctl(PR_GET_CHILD_SUBREAPER).
	ChildSubreaper bool   `json:"child_subreaper,omitempty"`
	TimerSlackNs   uint64 `json:"timer_slack_ns,omitempty"`
	// OOMScoreAdj is /proc/PID/oom_score_adj (-1000 to 1000); nil in a
	// snapshot taken before it was recorded.
	OOMScoreAdj *int     `json:"oom_score_adj,omitempty"`
	Creds       Creds    `json:"creds"`
	Rlimits     []Rlimit `json:"rlimits"`
	MM          MM       `json:"mm"`
	// SigActions holds the action of every signal 1..64 whose handler is
	// not SIG_DFL or whose flags or mask are set.
	SigActions []SigAction `json:"sigactions"`
	// SigPending is the shared pending-signal set (restored by sending
	// the signals again).
	SigPending uint64   `json:"sig_pending,omitempty"`
	Threads    []Thread `json:"threads"`
	VMAs       []VMA    `json:"vmas"`
	FDs        []FD     `json:"fds"`
	// CTTY, for a session leader whose controlling terminal was the
	// slave of a pair the processes held (FD.Pty), names the pair, and
	// the process group in the foreground of it (as PGID is given).
	CTTY *CTTY `json:"ctty,omitempty"`
	// SysVIPC, in the root's state of a snapshot, are the System V
	// semaphore sets and message queues the processes used
	// (FeatureSysVIPC).
	SysVIPC *SysVIPC `json:"sysv_ipc,omitempty"`
	// Zombies are the process's children that had exited and that it had
	// not reaped when it was frozen. A restore makes each again, exiting
	// as it did, for the process to reap: a server that counts its
	// children by pid (PostgreSQL's postmaster, a shell's jobs) would
	// otherwise wait for them forever. A snapshot taken before they were
	// recorded holds none: such children were left out, as if reaped.
	Zombies []Zombie `json:"zombies,omitempty"`
}

// Zombie is a child that had exited and that its parent had not reaped.
type Zombie struct {
	PID int `json:"pid"`
	// NSPID is its pid in each pid namespace, as Process.NSPID.
	NSPID []int  `json:"ns_pid,omitempty"`
	Comm  string `json:"comm"`
	// Status is what wait would report: the exit code << 8, or the
	// signal that killed it (0x80 set if it dumped core).
	Status int `json:"status"`
}

// OwnPID is the zombie's pid as its parent saw it (see Process.OwnPID).
func (z *Zombie) OwnPID() int {
	if n := len(z.NSPID); n > 0 {
		return z.NSPID[n-1]
	}
	return z.PID
}

// Exited reports whether the zombie exited (its code), rather than being
// killed by a signal.
func (z *Zombie) Exited() bool { return z.Status&0x7f == 0 }

// Describe says how it ended, as a shell would.
func (z *Zombie) Describe() string {
	if z.Exited() {
		return fmt.Sprintf("exited %d", z.Status>>8&0xff)
	}
	return fmt.Sprintf("killed by %v", unix.Signal(z.Status&0x7f))
}

// FileID identifies a file so restore can refuse one that changed.
type FileID struct {
	Path    string `json:"path"`
	Dev     uint64 `json:"dev"`
	Ino     uint64 `json:"ino"`
	Size    int64  `json:"size"`
	MtimeNs int64  `json:"mtime_ns"`
	Mode    uint32 `json:"mode,omitempty"`
}

// Creds are the process credentials.
type Creds struct {
	UID        [4]uint32 `json:"uid"` // real, effective, saved, fs
	GID        [4]uint32 `json:"gid"`
	Groups     []uint32  `json:"groups"`
	CapInh     uint64    `json:"cap_inh"`
	CapPrm     uint64    `json:"cap_prm"`
	CapEff     uint64    `json:"cap_eff"`
	CapBnd     uint64    `json:"cap_bnd"`
	CapAmb     uint64    `json:"cap_amb"`
	NoNewPrivs bool      `json:"no_new_privs,omitempty"`
	Seccomp    int       `json:"seccomp,omitempty"`
}

// Rlimit is one resource limit (RLIMIT_* number, soft and hard).
type Rlimit struct {
	Resource int    `json:"resource"`
	Cur      uint64 `json:"cur"`
	Max      uint64 `json:"max"`
}

// MM holds the mm fields that PR_SET_MM_MAP restores.
type MM struct {
	StartCode  uint64   `json:"start_code"`
	EndCode    uint64   `json:"end_code"`
	StartData  uint64   `json:"start_data"`
	EndData    uint64   `json:"end_data"`
	StartBrk   uint64   `json:"start_brk"`
	Brk        uint64   `json:"brk"`
	StartStack uint64   `json:"start_stack"`
	ArgStart   uint64   `json:"arg_start"`
	ArgEnd     uint64   `json:"arg_end"`
	EnvStart   uint64   `json:"env_start"`
	EnvEnd     uint64   `json:"env_end"`
	Auxv       []uint64 `json:"auxv"`
}

// SigAction is a kernel sigaction (struct kernel_sigaction on x86-64).
type SigAction struct {
	Signal   int    `json:"signal"`
	Handler  uint64 `json:"handler"` // 0 = SIG_DFL, 1 = SIG_IGN
	Flags    uint64 `json:"flags"`
	Restorer uint64 `json:"restorer"`
	Mask     uint64 `json:"mask"`
}

// Thread is the state of one thread.
type Thread struct {
	TID int `json:"tid"`
	// NSTID is the thread's id in each pid namespace from the dumper's
	// down, when Process.NSPID is set (OwnTID).
	NSTID []int  `json:"ns_tid,omitempty"`
	Comm  string `json:"comm"`
	// PdeathSig is prctl(PR_GET_PDEATHSIG), which the kernel keeps per
	// thread: the signal it gets when the thread that made it dies.
	PdeathSig int  `json:"pdeath_sig,omitempty"`
	Regs      Regs `json:"regs"`
	// XState is the NT_X86_XSTATE regset (FP, SSE, AVX... state).
	XState []byte `json:"xstate"`
	// FPRegs is the NT_PRFPREG regset, used when XState is empty.
	FPRegs        []byte   `json:"fpregs,omitempty"`
	SigMask       uint64   `json:"sigmask"`
	SigPending    uint64   `json:"sig_pending,omitempty"`
	AltStack      AltStack `json:"altstack"`
	Rseq          *Rseq    `json:"rseq,omitempty"`
	ClearChildTID uint64   `json:"clear_child_tid"`
	RobustList    uint64   `json:"robust_list"`
	RobustListLen uint64   `json:"robust_list_len"`
	// Syscall is the system call the thread was stopped in (orig_rax),
	// or -1. With Regs.Rax holding -ERESTART*, restore lets the kernel
	// restart it.
	Syscall int64 `json:"syscall"`
	// Sched is the thread's scheduling; nil in a snapshot taken before it
	// was recorded (restore then leaves what the restore made).
	Sched *Sched `json:"sched,omitempty"`
}

// Sched is a thread's scheduling, as the kernel keeps it per thread.
type Sched struct {
	// Nice is the nice value (-20 to 19).
	Nice int `json:"nice"`
	// Policy is sched_getscheduler(2)'s answer: SCHED_OTHER, FIFO, RR,
	// BATCH or IDLE, with SCHED_RESET_ON_FORK; RTPriority the real-time
	// priority (1 to 99 for FIFO and RR, else 0).
	Policy     uint32 `json:"policy"`
	RTPriority uint32 `json:"rt_priority,omitempty"`
	// Affinity is the CPU affinity mask, 64 CPUs a word, without its
	// trailing zero words.
	Affinity []uint64 `json:"affinity,omitempty"`
	// IOPrio is ioprio_get(2)'s answer (class << 13 | data).
	IOPrio int `json:"ioprio"`
}

// AltStack is a thread's sigaltstack.
type AltStack struct {
	SP    uint64 `json:"sp"`
	Flags int32  `json:"flags"`
	Size  uint64 `json:"size"`
}

// Rseq is a thread's restartable-sequences registration.
type Rseq struct {
	Addr  uint64 `json:"addr"`
	Len   uint32 `json:"len"`
	Sig   uint32 `json:"sig"`
	Flags uint32 `json:"flags,omitempty"`
}

// Regs are the x86-64 general registers (struct user_regs_struct).
type Regs struct {
	R15     uint64 `json:"r15"`
	R14     uint64 `json:"r14"`
	R13     uint64 `json:"r13"`
	R12     uint64 `json:"r12"`
	Rbp     uint64 `json:"rbp"`
	Rbx     uint64 `json:"rbx"`
	R11     uint64 `json:"r11"`
	R10     uint64 `json:"r10"`
	R9      uint64 `json:"r9"`
	R8      uint64 `json:"r8"`
	Rax     uint64 `json:"rax"`
	Rcx     uint64 `json:"rcx"`
	Rdx     uint64 `json:"rdx"`
	Rsi     uint64 `json:"rsi"`
	Rdi     uint64 `json:"rdi"`
	OrigRax uint64 `json:"orig_rax"`
	Rip     uint64 `json:"rip"`
	Cs      uint64 `json:"cs"`
	Eflags  uint64 `json:"eflags"`
	Rsp     uint64 `json:"rsp"`
	Ss      uint64 `json:"ss"`
	FsBase  uint64 `json:"fs_base"`
	GsBase  uint64 `json:"gs_base"`
	Ds      uint64 `json:"ds"`
	Es      uint64 `json:"es"`
	Fs      uint64 `json:"fs"`
	Gs      uint64 `json:"gs"`
}

// VMA kinds.
const (
	VMAAnon       = "anon"        // private anonymous (heap, stack, malloc arenas)
	VMAFile       = "file"        // private file mapping
	VMAFileShared = "file-shared" // shared file mapping (contents live in the file)
	VMAShmem      = "shmem"       // shared anonymous, memfd, /dev/zero shared, SysV
	VMAVDSO       = "vdso"
	VMAVVar       = "vvar"
	VMAVVarVclock = "vvar_vclock"
	VMAVsyscall   = "vsyscall"
)

// VMA is one virtual memory area.
type VMA struct {
	Start  uint64 `json:"start"`
	End    uint64 `json:"end"`
	Prot   int    `json:"prot"`  // PROT_* bits
	Flags  int    `json:"flags"` // MAP_PRIVATE or MAP_SHARED, plus MAP_GROWSDOWN etc.
	Offset uint64 `json:"offset"`
	Kind   string `json:"kind"`
	// Name is the maps name: a path, [heap], [stack], [anon:...], memfd:...
	Name string  `json:"name,omitempty"`
	File *FileID `json:"file,omitempty"`
	// VMFlags are the smaps VmFlags mnemonics (dd, wf, nh, lo...).
	VMFlags []string `json:"vmflags,omitempty"`
	// Dumped says whether pages of this VMA are in the pages image.
	Dumped bool `json:"dumped"`
	// Shmem names the shared object whose contents this VMA maps (an id
	// shared by every VMA of the same object); its pages are dumped once,
	// at the addresses of the first VMA that maps it.
	Shmem *ShmemRef `json:"shmem,omitempty"`
	// Inherited are the pages of a private anonymous VMA that the
	// process still shared copy-on-write with its parent when dumped (the
	// same physical pages at the same addresses, since fork), in address
	// order: restore forks the process from its parent once those are in,
	// so that they are shared again. Set only when the parent's VMA is
	// the same range, protection and flags. Their contents are in the
	// pages image too.
	Inherited []PageRange `json:"inherited,omitempty"`
	// Ghost, for a private mapping of a file deleted while mapped (a
	// library replaced by an upgrade), holds the file's contents in the
	// first VMA of it (the others of the same File.Dev and File.Ino have
	// none): restore maps a file made of them (FeatureGhostFiles).
	Ghost *Ghost `json:"ghost,omitempty"`
}

// PageRange is the pages [Start, End) of a process's memory.
type PageRange struct {
	Start uint64 `json:"start"`
	End   uint64 `json:"end"`
}

// ShmemRef links a shared mapping to the dumped contents of its object.
type ShmemRef struct {
	ID     uint64 `json:"id"`     // inode of the object
	Size   uint64 `json:"size"`   // size of the object
	Source uint64 `json:"source"` // address at which the object's offset 0 was dumped
	// Owner, when set, is the process of the tree whose pages hold the
	// object's contents (at Source in its memory): this process's pages
	// do not (FeatureTree).
	Owner int `json:"owner,omitempty"`
	// Tree says that other processes of the tree map the object too:
	// restore makes one object and maps it in each (FeatureTree).
	Tree bool `json:"tree,omitempty"`
	// SysV, when set, says the object is a System V shared memory
	// segment (shmat): restore makes one of this key, owner and mode
	// (FeatureSysVShm).
	SysV *SysVShm `json:"sysv,omitempty"`
}

// SysVShm is a System V shared memory segment a process had attached.
type SysVShm struct {
	// Key is the segment's key (0: IPC_PRIVATE); ID its shmid at the dump.
	Key int32 `json:"key"`
	ID  int   `json:"id"`
	// Mode is its permission bits, with SHM_DEST (01000) if it was marked
	// for destruction once detached (IPC_RMID while attached).
	Mode uint32 `json:"mode"`
	UID  uint32 `json:"uid"`
	GID  uint32 `json:"gid"`
}

// CTTY is a session's controlling terminal: a pseudo-terminal pair of
// the snapshot.
type CTTY struct {
	Pty        int `json:"pty"`
	Foreground int `json:"foreground"`
}

// SysVIPC are System V semaphore sets and message queues, which belong to
// an IPC namespace rather than to a process: those a process of the tree
// had last operated on (a semaphore's last semop, a queue's last msgsnd or
// msgrcv).
type SysVIPC struct {
	Sems []SysVSem `json:"sems,omitempty"`
	Msgs []SysVMsg `json:"msgs,omitempty"`
}

// SysVIPCObject is what a semaphore set and a message queue both have: key
// (0: IPC_PRIVATE), id at the dump, owner, permission bits, and the times
// of its last operation and change (seconds), by which restore tells the
// dumped object left behind from one used since.
type SysVIPCObject struct {
	Key   int32  `json:"key"`
	ID    int    `json:"id"`
	Mode  uint32 `json:"mode"`
	UID   uint32 `json:"uid"`
	GID   uint32 `json:"gid"`
	OTime int64  `json:"otime"` // last semop, or last msgsnd
	RTime int64  `json:"rtime,omitempty"`
	CTime int64  `json:"ctime"`
}

// SysVSem is a semaphore set and its values.
type SysVSem struct {
	SysVIPCObject
	Values []uint16 `json:"values"`
}

// SysVMsg is a message queue and the messages in it, oldest first.
type SysVMsg struct {
	SysVIPCObject
	QBytes   uint64        `json:"qbytes"`
	Messages []SysVMessage `json:"messages,omitempty"`
}

// SysVMessage is one queued message.
type SysVMessage struct {
	Type int64  `json:"type"`
	Data []byte `json:"data"`
}

// FeatureSysVIPC: the snapshot holds System V semaphore sets or message
// queues (Process.SysVIPC), which an older reader would leave out.
const FeatureSysVIPC = "sysv-ipc"

func init() { knownFeatures[FeatureSysVIPC] = true }

// FeatureSysVShm: a process had a System V shared memory segment
// attached (ShmemRef.SysV); an older reader would map a memfd instead,
// and the process would lose the segment.
const FeatureSysVShm = "sysv-shm"

func init() { knownFeatures[FeatureSysVShm] = true }

// FD kinds.
const (
	FDFile     = "file"
	FDDir      = "dir"
	FDChr      = "chr"
	FDFifo     = "fifo"
	FDPipe     = "pipe"
	FDEventfd  = "eventfd"
	FDEpoll    = "epoll"
	FDSocket   = "socket"
	FDTimerfd  = "timerfd"
	FDSignalfd = "signalfd"
	FDMemfd    = "memfd"
)

// FD is one open file descriptor.
type FD struct {
	FD      int    `json:"fd"`
	Kind    string `json:"kind"`
	Flags   int    `json:"flags"` // open flags (O_ACCMODE, O_APPEND, O_NONBLOCK...) without O_CLOEXEC
	CloExec bool   `json:"cloexec,omitempty"`
	// SameAs, when set, is the lower descriptor number that shares this
	// one's open file description (dup): restore duplicates that one
	// instead of opening another, so offset, flags and the object itself
	// stay shared. The other fields still describe the file.
	SameAs *int `json:"same_as,omitempty"`
	// Path and Pos for files, directories, devices and FIFOs.
	Path string  `json:"path,omitempty"`
	Pos  int64   `json:"pos,omitempty"`
	File *FileID `json:"file,omitempty"`
	Rdev uint64  `json:"rdev,omitempty"`

	Pipe     *Pipe     `json:"pipe,omitempty"`
	Eventfd  *Eventfd  `json:"eventfd,omitempty"`
	Epoll    *Epoll    `json:"epoll,omitempty"`
	Socket   *Socket   `json:"socket,omitempty"`
	Timerfd  *Timerfd  `json:"timerfd,omitempty"`
	Signalfd *Signalfd `json:"signalfd,omitempty"`
	// Tree links the descriptor to other processes of a tree
	// (FeatureTree).
	Tree *FDTree `json:"tree,omitempty"`
	// Ghost, for a regular file deleted while open, holds its contents:
	// restore recreates it unlinked (FeatureGhostFiles).
	Ghost *Ghost `json:"ghost,omitempty"`
	// Locks are the file locks held through this open file description:
	// flock and OFD locks it owns, and POSIX locks the process holds on
	// its file (restore takes them again on it).
	Locks []Lock `json:"locks,omitempty"`
	// External, when set, is the key ("pipe:[INO]", "socket:[INO]") of
	// a pipe or unix socket whose other end was outside the process
	// (dump --external): restore puts a descriptor it is handed
	// (--inherit-fd) or /dev/null in its place (state_external.go).
	External string `json:"external,omitempty"`
	// Termios, for a descriptor on a terminal outside the process
	// (External "tty"), are the terminal's settings at the dump: restore
	// --shell-job sets them on its own terminal.
	Termios *Termios `json:"termios,omitempty"`
	// Pty, for an end of a pseudo-terminal pair whose master the
	// processes held, names the pair; restore makes a new one
	// (FeaturePty).
	Pty *Pty `json:"pty,omitempty"`
}

// Pty is an end of a pseudo-terminal pair whose master the processes
// held (a terminal multiplexer, sshd, a supervisor running a job on a
// pty).
type Pty struct {
	// Index is the pair's number at the dump (its slave was
	// /dev/pts/Index); Master says this is the master.
	Index  int  `json:"index"`
	Master bool `json:"master,omitempty"`
	// State, on one master descriptor of the pair, is the terminal's.
	State *PtyState `json:"state,omitempty"`
}

// PtyState is a pseudo-terminal's settings, window size, and the bytes
// each way that were written and not yet read: Input to the master, for
// the slave's reader (with a line being typed), Output to the slave, for
// the master's reader.
type PtyState struct {
	Termios Termios `json:"termios"`
	Winsize Winsize `json:"winsize"`
	Input   []byte  `json:"input,omitempty"`
	Output  []byte  `json:"output,omitempty"`
}

// Winsize is a terminal's window size (struct winsize).
type Winsize struct {
	Row    uint16 `json:"row"`
	Col    uint16 `json:"col"`
	Xpixel uint16 `json:"xpixel,omitempty"`
	Ypixel uint16 `json:"ypixel,omitempty"`
}

// FeaturePty: the processes held a pseudo-terminal pair (FD.Pty), which
// an older reader would reopen by the slave's name, another pair's.
const FeaturePty = "pty"

func init() { knownFeatures[FeaturePty] = true }

// Termios are a terminal's settings (struct termios, TCGETS).
type Termios struct {
	Iflag  uint32   `json:"iflag"`
	Oflag  uint32   `json:"oflag"`
	Cflag  uint32   `json:"cflag"`
	Lflag  uint32   `json:"lflag"`
	Line   uint8    `json:"line"`
	Cc     [19]byte `json:"cc"`
	Ispeed uint32   `json:"ispeed"`
	Ospeed uint32   `json:"ospeed"`
}

// Ghost is an open file that was deleted (CRIU's ghost file), kept in the
// snapshot up to dump --ghost-limit: restore makes a file of these
// contents, owner and mode, never linked, in the directory it was in.
type Ghost struct {
	Mode uint32 `json:"mode"` // permission bits
	UID  uint32 `json:"uid"`
	GID  uint32 `json:"gid"`
	// Data is the file's contents; none when Of is set.
	Data []byte `json:"data,omitempty"`
	// Of, when set, is the lower descriptor of the process open on the
	// same deleted file (another open, not a dup): restore opens the file
	// it made for that one again.
	Of *int `json:"of,omitempty"`
}

// Lock is one file lock, as /proc/PID/fdinfo/N shows it.
type Lock struct {
	// Kind is LockFlock, LockPOSIX or LockOFD.
	Kind string `json:"kind"`
	// Write is an exclusive (write) lock; else shared (read).
	Write bool `json:"write,omitempty"`
	// Start and End are the bytes locked, End included; End -1 is to
	// the end of the file, however it grows (a flock covers it all).
	Start int64 `json:"start"`
	End   int64 `json:"end"`
}

// The kinds of Lock.
const (
	LockFlock = "flock"
	LockPOSIX = "posix"
	LockOFD   = "ofd"
)

// Pipe is one end of a pipe. Both ends of a pipe share the ID; the bytes
// buffered in it are stored once, with the read end.
type Pipe struct {
	ID       uint64 `json:"id"`             // inode
	Size     int    `json:"size,omitempty"` // F_GETPIPE_SZ
	Buffered []byte `json:"buffered,omitempty"`
}

// Eventfd is an eventfd counter.
type Eventfd struct {
	Count     uint64 `json:"count"`
	Semaphore bool   `json:"semaphore,omitempty"`
}

// Epoll is an epoll instance with its registered fds.
type Epoll struct {
	Targets []EpollTarget `json:"targets"`
}

// EpollTarget is one registered fd.
type EpollTarget struct {
	FD     int    `json:"fd"`
	Events uint32 `json:"events"`
	Data   uint64 `json:"data"`
}

// Socket is a socket's description.
type Socket struct {
	Family   int    `json:"family"`
	Type     int    `json:"type"`
	Protocol int    `json:"protocol"`
	State    string `json:"state"` // listen, established, bound, unbound, connected...
	Local    string `json:"local,omitempty"`
	Peer     string `json:"peer,omitempty"`
	Backlog  int    `json:"backlog,omitempty"`
	// Options holds the socket options restore sets: name -> value.
	Options map[string]int `json:"options,omitempty"`
	ID      uint64         `json:"id"` // inode
	// Queued is the data waiting in the receive queue of a unix socket
	// whose peer is in the process: one element for a stream socket, one
	// per message for a datagram socket. Restore sends it again from the
	// peer.
	Queued [][]byte `json:"queued,omitempty"`
	// TCP is the state of an established TCP connection taken with
	// TCP_REPAIR (dump --tcp-established), from which restore
	// --tcp-established brings it back connected (state_external.go).
	TCP *TCPConn `json:"tcp,omitempty"`
}

// Timerfd is a timerfd's clock and setting.
type Timerfd struct {
	Clock      int    `json:"clock"`
	Flags      int    `json:"flags,omitempty"` // TFD_TIMER_ABSTIME...
	Ticks      uint64 `json:"ticks,omitempty"`
	ValueNs    int64  `json:"value_ns"`
	IntervalNs int64  `json:"interval_ns"`
}

// Signalfd is a signalfd's mask.
type Signalfd struct {
	Mask uint64 `json:"mask"`
}

// Perms returns the maps-style permissions of v, e.g. "rw-p".
func Perms(v VMA) string {
	b := []byte("---p")
	if v.Prot&0x1 != 0 {
		b[0] = 'r'
	}
	if v.Prot&0x2 != 0 {
		b[1] = 'w'
	}
	if v.Prot&0x4 != 0 {
		b[2] = 'x'
	}
	if v.Flags&0x01 != 0 { // MAP_SHARED
		b[3] = 's'
	}
	return string(b)
}
