package lazy

import (
	"log/slog"
	"os"

	"github.com/lazyfs/lazyfs/engine/uffd"
)

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
