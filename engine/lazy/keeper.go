package lazy

import (
	"log/slog"
	"os"

	"github.com/lazyfs/lazyfs/engine/uffd"
)

// KeeperArg0 is the argv[0] of the keeper process that a lazy restore
// with Options.Keeper starts: the running program, re-executed. A program
// that sets Keeper must run KeeperMain before anything else when
// os.Args[0] is KeeperArg0, in an init function:
//
//	func init() {
//		if filepath.Base(os.Args[0]) == lazy.KeeperArg0 {
//			os.Exit(lazy.KeeperMain(os.Args))
//		}
//	}
const KeeperArg0 = uffd.KeeperArg0

// KeeperMain is the keeper process (args is its os.Args); it returns the
// exit code.
func KeeperMain(args []string) int { return uffd.KeeperMain(args, nil) }

// startKeeper starts the keeper, or returns nil (with a warning) if it
// cannot.
func startKeeper(log *slog.Logger) *uffd.Keeper {
	exe, err := os.Executable()
	var k *uffd.Keeper
	if err == nil {
		k, err = uffd.StartKeeper(exe)
	}
	if err != nil {
		log.Warn("no userfaultfd keeper: if snapctl is killed, the processes may see zero pages before they die", "err", err)
		return nil
	}
	return k
}
