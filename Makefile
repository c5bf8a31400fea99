# lazyfs: build, test, benchmark and fuzz entry points (see README.md).
#
#   make build   binaries of ./cmd/... into bin/
#   make test    lint, the go.mod tidiness check, race-detector tests of the
#                pure packages, the FUSE server, the userfaultfd pager, the
#                tracer and the engine, then every other test (as root with LAZYFS_TEST_REQUIRE=all in CI:
#                .ci/run); every stage runs even if one fails, and a
#                summary of every failure ends it
#   make bench   the benchmark harness (test/bench, root, about 15 minutes):
#                snapshot size, dump time, eager and lazy restore to first
#                response of a 1 GiB modelserver, cold and warm, with the
#                pages-file and lz4 baselines, and of a 1 GiB weightserver
#                with and without MADV_HUGEPAGE, and of a PyTorch server (with
#                CRIU's figures beside them where criu works: $$CRIU or PATH);
#                writes test/bench/BENCHMARKS.md and its SVG charts.
#                BENCH_LARGE=1 adds 4 GiB (about 4x longer); BENCH_HUGE=1 a
#                12 GiB weightserver dumped and restored once (1.5 minutes more here);
#                BENCH_FLAGS passes more flags (-size, -runs, -out, -work,
#                -only SERIES to measure one series into another -out)
#   make bench-smoke  the harness at 64 MiB, one run, into bin/bench-smoke
#                (about 2 minutes; CI runs the same through TestSmoke in make test)
#   make gobench go test benchmarks of every package, output also in bin/bench.txt
#   make fuzz    every Fuzz target for FUZZTIME each
#   make lint    gofmt and go vet
#   make tidy    check that go.mod and go.sum are tidy (go mod tidy -diff)
#   make setup   install what the build and tests need (.ci/setup: Debian 12, root)
#   make demo    set up what the demo needs (.ci/setup demo: Debian packages,
#                no test servers), build, then the whole tool in a minute:
#                dump, mount, lazy restore
#   make install install snapctl and lazyfs into $(DESTDIR)$(PREFIX)/bin
#                (PREFIX=/usr/local), their manual pages (section 8, made
#                from their --help) and their bash, zsh and fish completion;
#                make uninstall removes them
#   make clean   remove build outputs and compiled test fixtures

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

GO ?= go
BIN ?= bin

# Packages tested with -race: those that need no privileges, processes or
# mounts, and the most concurrent code, which does: the FUSE server (fs),
# the userfaultfd pager (engine/uffd) and the lazy phase that runs one per
# process (engine/lazy), the tracer and its typed calls (engine/ptrace, engine/ptrace/syscalls), the engine's own tests and the object store's client (engine/image/store/s3,
# against a MinIO server of its own). The end-to-end tests (test/...) run the binaries on
# real processes and big fixtures, too slowly under the race detector.
PURE_DIRS ?= engine/codec engine/image engine/image/store engine/image/store/cache engine/image/store/trace engine/image/store/archive engine/proc engine/proc/kernel engine/proc/pagemap engine/proc/sockdiag engine/units cache test/testutil
RACE_DIRS ?= $(PURE_DIRS) fs engine/uffd engine/lazy engine/ptrace engine/ptrace/syscalls engine engine/image/store/s3
RACE_PKGS := $(foreach d,$(RACE_DIRS),$(if $(wildcard $(d)/*.go),./$(d)))

TEST_TIMEOUT ?= 15m
TESTFLAGS ?=
BENCHTIME ?= 1s
BENCHCOUNT ?= 1
BENCH ?= .
FUZZTIME ?= 30s
FUZZ_PKGS ?= ./...

PREFIX ?= /usr/local
DESTDIR ?=
BINDIR ?= $(PREFIX)/bin
MANDIR ?= $(PREFIX)/share/man
BASHCOMPDIR ?= $(PREFIX)/share/bash-completion/completions
ZSHCOMPDIR ?= $(PREFIX)/share/zsh/site-functions
FISHCOMPDIR ?= $(PREFIX)/share/fish/vendor_completions.d
TOOLS := snapctl lazyfs

.PHONY: all setup setup-demo build install uninstall test vet race test-all bench bench-smoke gobench fuzz lint tidy demo clean

# GNU make starts recipes with posix_spawn, which in glibc 2.36 leaves
# signals 32 and 33 ignored in the child, and an ignored signal stays ignored
# across exec: every test and every process a test starts would inherit it.
# Tests therefore run through launch (test/fixtures/launch.c), which resets
# every signal to its default and closes inherited descriptors, then execs.
LAUNCH := $(BIN)/launch

all: build

build:
	$(GO) build -o $(BIN)/ ./cmd/...

# install: the manual pages and completion scripts are written by the
# tools themselves from the definitions of their options (--manpages,
# --completion), so they say what --help says.
install: build
	install -d "$(DESTDIR)$(BINDIR)" "$(DESTDIR)$(MANDIR)/man8" "$(DESTDIR)$(BASHCOMPDIR)" \
		"$(DESTDIR)$(ZSHCOMPDIR)" "$(DESTDIR)$(FISHCOMPDIR)"
	tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	for t in $(TOOLS); do \
		install -m 0755 "$(BIN)/$$t" "$(DESTDIR)$(BINDIR)/$$t"; \
		"$(BIN)/$$t" --manpages "$$tmp/man"; \
		"$(BIN)/$$t" --completion bash >"$$tmp/$$t.bash"; \
		"$(BIN)/$$t" --completion zsh >"$$tmp/_$$t"; \
		"$(BIN)/$$t" --completion fish >"$$tmp/$$t.fish"; \
		install -m 0644 "$$tmp/$$t.bash" "$(DESTDIR)$(BASHCOMPDIR)/$$t"; \
		install -m 0644 "$$tmp/_$$t" "$(DESTDIR)$(ZSHCOMPDIR)/_$$t"; \
		install -m 0644 "$$tmp/$$t.fish" "$(DESTDIR)$(FISHCOMPDIR)/$$t.fish"; \
	done && \
	install -m 0644 "$$tmp"/man/*.8 "$(DESTDIR)$(MANDIR)/man8/"

uninstall:
	for t in $(TOOLS); do \
		rm -f "$(DESTDIR)$(BINDIR)/$$t" "$(DESTDIR)$(MANDIR)/man8/$$t".8 "$(DESTDIR)$(MANDIR)/man8/$$t"-*.8 \
			"$(DESTDIR)$(BASHCOMPDIR)/$$t" "$(DESTDIR)$(ZSHCOMPDIR)/_$$t" "$(DESTDIR)$(FISHCOMPDIR)/$$t.fish"; \
	done

$(LAUNCH): test/fixtures/launch.c test/fixtures/fixture.h
	mkdir -p $(BIN)
	gcc -O2 -Wall -Wextra -Werror -I test/fixtures -o $@ test/fixtures/launch.c

vet:
	$(GO) vet ./...

# race: RACE_DIRS under the race detector.
race: $(LAUNCH)
	$(if $(RACE_PKGS),$(LAUNCH) $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) $(TESTFLAGS) $(RACE_PKGS),@echo "no packages to race")

# test-all: every other package, without the race detector (they run real
# processes, FUSE mounts and big fixtures).
test-all: $(LAUNCH)
	raced=" $$($(if $(RACE_PKGS),$(GO) list $(RACE_PKGS),true) | tr '\n' ' ') "; \
	pkgs=(); \
	for p in $$($(GO) list ./...); do \
		[[ "$$raced" == *" $$p "* ]] || pkgs+=("$$p"); \
	done; \
	if [ $${#pkgs[@]} -eq 0 ]; then echo "no packages to test"; exit 0; fi; \
	$(LAUNCH) $(GO) test -count=1 -timeout $(TEST_TIMEOUT) $(TESTFLAGS) "$${pkgs[@]}"

# test: every stage, each run even when one before it failed, then one
# summary of every failure (test/stages.sh; logs in $(BIN)/test-*.log).
test: $(LAUNCH)
	BIN=$(BIN) MAKE="$(MAKE)" bash test/stages.sh lint tidy race test-all

BENCH_LARGE ?=
BENCH_HUGE ?=
BENCH_FLAGS ?=

bench: build $(LAUNCH)
	$(LAUNCH) $(GO) run ./test/bench -bin $(BIN) -out test/bench \
		$(if $(filter 1,$(BENCH_LARGE)),-large) $(if $(filter 1,$(BENCH_HUGE)),-huge) $(BENCH_FLAGS)

bench-smoke: build $(LAUNCH)
	$(LAUNCH) $(GO) run ./test/bench -bin $(BIN) -smoke -out $(BIN)/bench-smoke $(BENCH_FLAGS)

gobench: $(LAUNCH)
	$(LAUNCH) $(GO) test -run '^$$' -bench '$(BENCH)' -benchmem -benchtime $(BENCHTIME) \
		-count $(BENCHCOUNT) -timeout 60m ./... | tee $(BIN)/bench.txt

# fuzz: each Fuzz target of each package in turn (go test -fuzz takes one
# target of one package at a time).
fuzz:
	for pkg in $$($(GO) list $(FUZZ_PKGS)); do \
		list=$$($(GO) test -list '^Fuzz' "$$pkg"); \
		for target in $$(grep '^Fuzz' <<<"$$list" || true); do \
			echo "== fuzz $$pkg $$target for $(FUZZTIME)"; \
			$(GO) test -run '^$$' -fuzz "^$$target\$$" -fuzztime $(FUZZTIME) "$$pkg"; \
		done; \
	done

lint:
	unformatted=$$(gofmt -l .); \
	if [ -n "$$unformatted" ]; then echo "gofmt -l:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...

# tidy: go.mod and go.sum say exactly what the code imports (go mod tidy
# -diff prints what tidying would change, and fails if anything).
tidy:
	$(GO) mod tidy -diff

setup:
	bash .ci/setup

# setup-demo: only what the demo needs (no test servers, no MinIO build).
setup-demo:
	bash .ci/setup demo

demo: setup-demo build
	test/demo/demo.sh

clean:
	rm -rf $(BIN) test/fixtures/bin
