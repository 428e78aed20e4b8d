#!/usr/bin/env bash
# Run a command (a timing script of this folder) with Chromium's threads at nice -19, renicing
# every thread of the browser's processes once a second while it runs: Chromium sets its
# own priorities (the GPU process's SwiftShader workers at 0), and on a machine shared with
# other jobs the timings otherwise follow their load. Needs root (negative nice values).
#     bash reniced.sh bash forward-rounds.sh 2 'QUERY A' 'QUERY B'
#     bash reniced.sh node kernel-ab.mjs kernel-ab.json --reps 10
set -uo pipefail
cd "$(dirname "$0")"
browser="${CHROMIUM_PROCESS:-/usr/lib/chromium/chromium}"
"$@" &
pid=$!
while kill -0 "$pid" 2>/dev/null; do
    for p in $(pgrep -f "$browser"); do
        for t in /proc/"$p"/task/*; do renice -n -19 -p "${t##*/}" >/dev/null 2>&1; done
    done
    sleep 1
done
wait "$pid"
