#!/usr/bin/env bash
# Compiles and runs the host emulations of pool.cu and norm.cu (see README.md). Needs a C++20
# compiler (g++ or clang++); no GPU, no CUDA toolkit. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")"
CXX="${CXX:-c++}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
for t in pool_gather norm; do
    "$CXX" -std=c++20 -O1 -w -pthread -Istubs -I../../src/cuda "$t.cpp" -o "$out/$t"
    line="$("$out/$t" | tail -1)"
    echo "$t: $line"
    [[ "$line" == *" 0 failures" ]]
done
