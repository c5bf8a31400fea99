package lazy

import (
	"log/slog"
	"os"

	"github.com/lazyfs/lazyfs/engine/uffd/keeper"
)

// startKeeper starts the keeper, or returns nil (with a warning) if it
// cannot.
func startKeeper(log *slog.Logger) *keeper.Keeper {
	exe, err := os.Executable()
	var k *keeper.Keeper
	if err == nil {
		k, err = keeper.Start(exe)
	}
	if err != nil {
		log.Warn("no userfaultfd keeper: if snapctl is killed, the processes may see zero pages before they die", "err", err)
		return nil
	}
	return k
}
