#!/usr/bin/env bash
# fastpath-count.sh OBJ - disassemble ivt_fastpath_write4() (tools/fastpath.c:
# ivt_write() of a constant 32-byte payload) up to its first `ret`, which is
# the fast path (gcc lays the likely branches out first), print it, count
# its instructions, and fail if it contains a call.
set -euo pipefail
obj=$1
dis=$(objdump -d --no-show-raw-insn "$obj")
asm=$(awk '/<ivt_fastpath_write4>:/ { on = 1; next }
	   on && /^$/ { exit }
	   on { print } on && /\tret/ { exit }' <<<"$dis")
echo "$asm"
n=$(grep -c $'^ *[0-9a-f]*:\t' <<<"$asm")
frame=$(grep -cE $'\t(push|pop|ret|sub +\\$0x[0-9a-f]+,%rsp|add +\\$0x[0-9a-f]+,%rsp)' <<<"$asm" || true)
if grep -qE $'\tcall' <<<"$asm"; then
	echo "fastpath: FAIL: a call on the fast path" >&2
	exit 1
fi
echo "fastpath: $n instructions to ret, no call ($frame of them the wrapper's frame and ret)"
