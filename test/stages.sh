#!/usr/bin/env bash
# make test's driver: runs each stage given (make targets: lint, tidy,
# race, test-all) whether or not the ones before it failed, keeps each
# stage's output in $BIN/test-STAGE.log, then prints one summary of every
# failure: the stages that failed, the packages and tests that failed in
# them, and any panic or timeout. Exits 1 if anything failed.
#
# Its last line counts what ran: the lint and tidy checks and the go test
# packages, passed and failed.
set -uo pipefail

bin=${BIN:-bin}
make=${MAKE:-make}
mkdir -p "$bin"

failed_stages=()
passed=0
failed=0
for stage in "$@"; do
	log="$bin/test-$stage.log"
	echo "== make $stage (output also in $log)"
	start=$SECONDS
	"$make" --no-print-directory "$stage" 2>&1 | tee "$log"
	rc=${PIPESTATUS[0]}
	echo "== make $stage: exit $rc after $((SECONDS - start)) s"
	# go test prints "ok  PKG" or "FAIL\tPKG" once per package.
	ok=$(grep -cE '^ok[[:space:]]' "$log")
	bad=$(grep -cE '^FAIL[[:space:]]+[^[:space:]]' "$log")
	if [ "$ok" -eq 0 ] && [ "$bad" -eq 0 ]; then
		# A check (lint, tidy) or a stage that failed before testing.
		if [ "$rc" -eq 0 ]; then ok=1; else bad=1; fi
	elif [ "$rc" -ne 0 ] && [ "$bad" -eq 0 ]; then
		bad=1 # failed outside any package's tests (a build, the launcher)
	fi
	passed=$((passed + ok))
	failed=$((failed + bad))
	[ "$rc" -eq 0 ] || failed_stages+=("$stage")
done

echo
echo "== summary"
if [ ${#failed_stages[@]} -eq 0 ]; then
	echo "every stage passed: $*"
else
	for stage in "${failed_stages[@]}"; do
		log="$bin/test-$stage.log"
		echo "stage $stage failed ($log):"
		# Failed tests and packages, panics and test binary timeouts, and
		# for checks without tests, the last lines they printed.
		if grep -qE '^(---|    ---) FAIL|^FAIL[[:space:]]|^panic:' "$log"; then
			# A panic's first line and, for a timeout, the tests it
			# names (tab-indented lines after "running tests:").
			awk '/^[[:space:]]*--- FAIL|^FAIL[[:space:]]+[^[:space:]]/ { print; next }
				/^panic:/ { print; p = 1; next }
				p && /^\t/ { print; next }
				{ p = 0 }' "$log" | sed 's/^/  /'
		else
			tail -n 15 "$log" | sed 's/^/  /'
		fi
	done
fi
echo "test: $passed passed, $failed failed"
[ ${#failed_stages[@]} -eq 0 ]
