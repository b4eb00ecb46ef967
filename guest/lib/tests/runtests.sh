#!/usr/bin/env bash
# runtests.sh TIMEOUT TEST... - run each test program under `timeout`.
# Exit status of a test: 0 pass, 77 skip, anything else (124: timed out)
# a failure. Prints one line per test and a summary; exits 1 on any failure.
set -u
limit=$1; shift
pass=0 fail=0 skip=0 failed=()
for t in "$@"; do
	name=${t##*/}
	start=$(date +%s%N)
	out=$(timeout --kill-after=10 "$limit" "$t" 2>&1); rc=$?
	cs=$((($(date +%s%N) - start) / 10000000))
	secs=$(printf '%d.%02d' $((cs / 100)) $((cs % 100)))
	case $rc in
	0)  pass=$((pass + 1)); printf 'PASS  %-20s %6ss\n' "$name" "$secs" ;;
	77) skip=$((skip + 1)); printf 'SKIP  %-20s %6ss  %s\n' "$name" "$secs" "${out##*SKIP: }" ;;
	*)  fail=$((fail + 1)); failed+=("$name")
	    [ $rc -eq 124 ] && out+=$'\n'"(timed out after ${limit}s)"
	    printf 'FAIL  %-20s %6ss  (exit %d)\n%s\n' "$name" "$secs" "$rc" "$out" ;;
	esac
done
echo "tests: $pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ] || { echo "failed: ${failed[*]}"; exit 1; }
