#!/bin/sh
# ptxas_log.sh COMMAND... - the compiler launcher of the nvcc build (kernels/cuda/CMakeLists.txt):
# runs COMMAND, an nvcc compile with -Xptxas=-v, keeps ptxas's report (registers, spills, stack,
# shared memory per kernel and architecture) in OBJECT.ptxas next to the object that `-o OBJECT`
# names, and passes every other line of the compiler's output on. tests/scripts/kernel_resources.py
# reads the reports. (A ccache hit replays the compiler's output, so the report is written then too.)
obj=
prev=
for arg in "$@"; do
  [ "$prev" = "-o" ] && obj=$arg
  prev=$arg
done
out=$(mktemp)
"$@" 2> "$out"
rc=$?
if [ -n "$obj" ]; then
  grep -E '^(ptxas info|    [0-9]+ bytes stack frame)' "$out" > "$obj.ptxas"
fi
grep -vE '^(ptxas info|    [0-9]+ bytes stack frame)' "$out" >&2
rm -f "$out"
exit $rc
