package store

import (
	"os"
	"testing"
)

// TestRegisterTwice: a scheme, or the file store, registered twice is a
// bug of the build: it panics rather than replace the first.
func TestRegisterTwice(t *testing.T) {
	RegisterScheme("test-twice", Scheme{})
	defer func() {
		schemesMu.Lock()
		delete(schemes, "test-twice")
		schemesMu.Unlock()
	}()
	for name, register := range map[string]func(){
		"scheme":     func() { RegisterScheme("test-twice", Scheme{}) },
		"file store": func() { RegisterFileStore(func(*os.File) (Store, error) { return nil, nil }); RegisterFileStore(nil) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s registered twice: no panic", name)
				}
			}()
			register()
		}()
	}
	schemesMu.Lock()
	fileStore = nil
	schemesMu.Unlock()
}
