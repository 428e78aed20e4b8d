#!/usr/bin/env bash
# First-call and warm forward times of the page in headless Chromium, variants alternated
# round by round (each page load is a fresh device: the first call compiles the pipelines),
# with the load average before each run: timing on a shared machine needs pairs.
#     bash forward-rounds.sh ROUNDS 'QUERY A' 'QUERY B' ...
# e.g. the issue-13 shape, the CPU-adapter default against the previous kernel (tiles=32x32):
#     bash forward-rounds.sh 3 'T=2048&H=2&HV=4&K=128&V=128&steps=0&runs=4' \
#         'T=2048&H=2&HV=4&K=128&V=128&steps=0&runs=4&tiles=32x32'
# Needs the page built (build.sh) and playwright-core installed (run-headless-test.sh does both).
set -euo pipefail
cd "$(dirname "$0")"
rounds=$1
shift
for ((r = 1; r <= rounds; r++)); do
    queries=("$@")
    # Alternate the order round by round.
    if ((r % 2 == 0)); then
        for ((i = 0, j = ${#queries[@]} - 1; i < j; i++, j--)); do
            t=${queries[i]}; queries[i]=${queries[j]}; queries[j]=$t
        done
    fi
    for q in "${queries[@]}"; do
        load=$(cut -d' ' -f1 /proc/loadavg)
        line=$(node headless-test.mjs "$q" 2>&1 | grep -E "forward calls|outside the kernels|page says: (FAIL|ERROR)|failed" | sed 's/^headless-test \[[^]]*\] //')
        echo "round $r, load $load, $q: $line"
    done
done
