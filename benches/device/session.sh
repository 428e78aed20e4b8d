#!/usr/bin/env bash
# One device call (the H200): FLA in the background while `gdn precompile` fills the NVRTC cache,
# then every GPU test, the compare table (ours CUDA + WGSL bf16 against FLA from this call),
# the backward and decode benches. Stages run in the order given (default: all of them);
# a stage that would start after SESSION_SECS (default 540) of the call is skipped and says so.
# Everything lands in $OUT/all.tar.xz (the device returns only a few files).
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"; ROOT="$(cd "$HERE/../.." && pwd)"
cd "$HERE"; for f in *.xz; do case "$f" in triton-cache.tar.xz) ;; *) xz -d -f "$f" ;; esac; done
chmod +x ./gdn ./gdn-base ./*-bin 2>/dev/null
t0=$(date +%s); stamp() { echo "== [$(( $(date +%s) - t0 ))s $(date -u +%H:%M:%S)] $*"; }
late() { [ $(( $(date +%s) - t0 )) -gt "${SESSION_SECS:-540}" ] && { stamp "skipped: $1 (past ${SESSION_SECS:-540} s)"; return 0; }; return 1; }
export GDN_REQUIRE_GPU=1 GDN_REQUIRE_COOP=1 GDN_REQUIRE_CUDA=1
res=/tmp/session-out; mkdir -p "$res" /tmp/wf /tmp/wo /tmp/tc
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
[ -f triton-cache.tar.xz ] && tar -xJf triton-cache.tar.xz -C /tmp

fla() {
    cp shapes.json /tmp/wf/ours_shapes.json
    stamp "FLA (background) + precompile"
    ( cd "$ROOT" && TRITON_CACHE_DIR=/tmp/tc FLA_DTYPES=bf16 WORK=/tmp/wf GDN="$HERE/gdn" \
        timeout 260 bash benches/compare/run.sh fla > "$res/fla.log" 2>&1 ) &
    local pid=$!
    ./gdn precompile 2>&1 | tail -20
    wait $pid; stamp "FLA rc=$?"; tail -25 "$res/fla.log"
    cp /tmp/wf/fla.json /tmp/wo/ && cp /tmp/wf/fla.json "$res/"
    # Keep the Triton cache: carried next time, FLA takes ~14 s instead of ~110.
    tar -cJf "$res/triton-cache.tar.xz" -C /tmp tc
}
t() { local name=$1; shift; late "test $name" && return; stamp "test $name $*"
      timeout "${TSECS:-150}" ./$name-bin "$@" > "$res/test-$name.log" 2>&1; echo "rc=$?"
      grep -E "^test result|FAILED|panicked|failed|error" "$res/test-$name.log" | tail -15; }
tests() {
    t cuda --skip every_cuda_source_is_registered --test-threads 6
    t forward coop_matrix_path wy_inverse_coop both_algorithms_forced_on_the_hard_cases sequence_parallel_segments
    t backward coop_matrix_path coop_grads_all_forced coop_grads_mixed coop_grads_none_forced half_precision_storage
    t segment_window
}
# The WGSL forward and backward suites whole (the scalar passes too), after WGSL-only changes.
wgputests() { t forward; t backward; }
# NVRTC's cache filled on parallel threads (the fla stage does it beside FLA).
precompile() { stamp precompile; ./gdn precompile 2>&1 | tail -3; }
# Only the CUDA backend's tests (a call that changed nothing but CUDA kernels).
cudatests() { t cuda --skip every_cuda_source_is_registered --test-threads 6; }
decode() { TSECS=${DECODE_SECS:-240} t decode --test-threads 16; }
compare() {
    late compare && return; stamp compare
    ( cd "$ROOT" && WORK=/tmp/wo GDN="$HERE/gdn" BENCH_ARGS="--heads 16/64,16/32,2/8 --seqs 1x32768,1x8192,4096x8 --decode-batch 1,64,256 --reps 10" \
        bash benches/compare/run.sh ours-cuda ours-bf16 report ) > "$res/compare.log" 2>&1
    tail -30 "$res/compare.log"; cp /tmp/wo/*.json /tmp/wo/*.md "$res/" 2>/dev/null
}
bench() {
    late "cuda backward" || { stamp "cuda backward"
        ./gdn bench --backend cuda --ops backward --heads 16/32,2/8,16/64 --seqs 1x32768 --dtype bf16 --reps 5 --no-progress --json "$res/cuda_backward.json" 2>&1 | tail -8; }
    late "wgpu backward" || { stamp "wgpu backward"
        ./gdn bench --ops backward --heads 16/32 --seqs 1x32768 --dtype bf16 --reps 3 --no-progress --json "$res/wgpu_backward.json" 2>&1 | tail -5; }
    late "wgpu decode" || { stamp "wgpu decode"
        ./gdn bench --ops decode --heads 16/32,16/64 --decode-batch 1,64,256 --dtype f32 --reps 50 --no-progress --json "$res/wgpu_decode.json" 2>&1 | tail -10; }
}
# Nsight Compute of the kernels that bound the targets, at full size (the first launch of each
# is the bench's small oracle check: skipped), with per-instruction stall samples
# (SourceCounters) kept as a report and as the SASS page in CSV. Not in the default stages.
# The kernels are compiled with line info (GDN_CUDA_LINEINFO=1, a cache entry of their own),
# so that the report can map instructions to shaders/cuda's lines, and the report imports the
# source (ncu-*-cuda.csv: the per-line export; 2026-12-03 with `--source-folders` and no
# imported source it held only ncu's refusal, "--source-folder option requires --import-source
# on"; the imported-source form is not yet run on the device).
prof() { local name=$1 kernel=$2; shift 2; late "profile $name" && return; stamp "profile $name"
    GDN_CUDA_LINEINFO=1 timeout "${PSECS:-120}" ncu --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
        --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section SourceCounters \
        --import-source yes -k "regex:$kernel" --launch-skip 1 -c 1 -f -o "$res/ncu-$name" \
        ./gdn bench --backend cuda "$@" --dtype bf16 --reps 1 --warmup 1 --no-progress > "$res/ncu-$name.log" 2>&1
    echo "rc=$?"; ncu -i "$res/ncu-$name.ncu-rep" --print-summary per-kernel 2>/dev/null | grep -E "Duration|Registers|Shared Memory Config|Achieved Occupancy|Warp Cycles Per Issued|Issue Slots Busy" | head -12
    ncu -i "$res/ncu-$name.ncu-rep" --page source --csv --print-source sass > "$res/ncu-$name-sass.csv" 2>/dev/null
    ncu -i "$res/ncu-$name.ncu-rep" --page source --csv --print-source cuda,sass > "$res/ncu-$name-cuda.csv" 2>&1; }
profile() {
    late profile && return; GDN_CUDA_LINEINFO=1 ./gdn precompile 2>&1 | tail -1
    prof fwd-prep 'gdn_chunk_prep_' --ops forward --heads 16/64 --seqs 1x8192
    prof fwd-chain 'gdn_chunk_fwd' --ops forward --heads 16/64 --seqs 1x8192
    prof bwd-chains 'gdn_chunk_bwd_(chains|apart)' --ops backward --heads 16/32 --seqs 1x8192
    prof bwd-grad 'gdn_chunk_bwd_grad_' --ops backward --heads 16/32 --seqs 1x8192
}
# The forward's main pass alone (profile's fwd-chain).
fwdprofile() { late fwdprofile && return; GDN_CUDA_LINEINFO=1 ./gdn precompile 2>&1 | tail -1
    prof fwd-chain 'gdn_chunk_fwd' --ops forward --heads 16/64 --seqs 1x8192; }
# gdn (this tree) against gdn-base (pack.sh's BASE) on the CUDA forward and backward, fresh
# processes, alternated over two rounds (AB_ARGS: the shapes; both compile first).
ab() { [ -x ./gdn-base ] || { stamp "ab: no gdn-base (pack.sh BASE=<rev>)"; return; }; late ab && return
    stamp "ab: $(cat gdn.rev 2>/dev/null) against base $(cat gdn-base.rev 2>/dev/null)"
    ./gdn-base precompile 2>&1 | tail -3
    local args=${AB_ARGS:---ops forward,backward --heads 16/32,2/8,16/64 --seqs 1x32768}
    for round in 1 2; do for bin in gdn gdn-base; do late "ab $bin round $round" && return
        echo "-- $bin round $round"
        ./$bin bench --backend cuda $args --dtype bf16 --reps 5 --no-progress --json "$res/ab-$bin-$round.json" 2>&1 | tail -8
    done; done; }
# gdn (this tree) against gdn-base on the WGSL (Vulkan) path, fresh processes, alternated over
# two rounds, and gdn once more per round with --whole-op-timing (no timestamps between passes,
# which would time passes that can overlap one after the other; gdn-base may predate the flag).
# WAB_CASES: `;`-separated bench arguments, one process each. Not in the default stages.
wgpuab() { [ -x ./gdn-base ] || { stamp "wgpuab: no gdn-base (pack.sh BASE=<rev>)"; return; }; late wgpuab && return
    stamp "wgpuab: $(cat gdn.rev 2>/dev/null) against base $(cat gdn-base.rev 2>/dev/null)"
    local cases=${WAB_CASES:-"--ops backward --heads 16/32 --dtype bf16;--ops backward --heads 16/32 --dtype bf16 --backward-budget unbounded;--ops backward --heads 16/32 --dtype f32;--ops forward --heads 2/8,16/32 --dtype bf16;--ops forward --heads 2/8,16/64 --dtype f32"}
    IFS=';' read -r -a list <<< "$cases"
    for round in 1 2; do for n in "${!list[@]}"; do
        for run in "gdn" "gdn-base" "gdn --whole-op-timing"; do late "wgpuab $run case $n round $round" && return
            local bin=${run%% *} extra=""; [ "$run" != "$bin" ] && extra=${run#* }
            echo "-- $run round $round: ${list[$n]}"
            ./$bin bench ${list[$n]} --seqs 1x32768 --reps 3 --no-progress $extra \
                --json "$res/wab-$n-${run// /}-$round.json" 2>&1 | grep -v "^\s*$" | tail -14
        done
    done; done; }
# The kernels' variants with this one binary (GDN_CUDA_DEFINES, docs/configuration.md): VARIANTS
# is a `;`-separated list of define lists (an empty entry: the defaults), each timed in a fresh
# process, alternated over two rounds (AB_ARGS: the shapes). Round 1 also compiles each variant
# (its cache entries are its own), outside the timed runs. Not in the default stages.
variants() { late variants && return; stamp "variants: ${VARIANTS:-}"
    local args=${AB_ARGS:---ops forward,backward --heads 16/32,2/8,16/64 --seqs 1x32768}
    IFS=';' read -r -a list <<< "${VARIANTS:-}"
    for round in 1 2; do for n in "${!list[@]}"; do late "variant $n round $round" && return
        echo "-- variant $n (${list[$n]:-defaults}) round $round"
        GDN_CUDA_DEFINES="${list[$n]}" ./gdn bench --backend cuda $args --dtype bf16 --reps 5 --no-progress \
            --json "$res/var-$n-$round.json" 2>&1 | tail -8
    done; done; }
# This binary under environment variants (ENVS: `;`-separated lists of assignments, e.g.
# `GDN_FWD_WGMMA=0;GDN_FWD_WGMMA=1`; an empty entry: none), each timed in a fresh process,
# alternated over two rounds (AB_ARGS: the shapes). Not in the default stages.
envs() { late envs && return; stamp "envs: ${ENVS:-}"
    local args=${AB_ARGS:---ops forward,backward --heads 16/32,2/8,16/64 --seqs 1x32768}
    IFS=';' read -r -a list <<< "${ENVS:-}"
    for round in 1 2; do for n in "${!list[@]}"; do late "env $n round $round" && return
        echo "-- env $n (${list[$n]:-none}) round $round"
        env ${list[$n]} ./gdn bench --backend cuda $args --dtype bf16 --reps 5 --no-progress \
            --json "$res/env-$n-$round.json" 2>&1 | tail -8
    done; done; }
# The chunked backward's automatic schedule against forced alternatives (docs/cuda.md's
# ChainSchedule, pairs, segments), a fresh process each, two rounds. Not in the default stages.
sweep() { late sweep && return; stamp "sweep: backward schedules"
    local n=0
    one() { local shape=$1; shift; n=$((n + 1)); late "sweep $shape $*" && return; echo "-- $shape $*"
        env "$@" ./gdn bench --backend cuda --ops backward --heads "$shape" --seqs 1x32768 --dtype bf16 --reps 5 \
            --no-progress --json "$res/sweep-$n.json" 2>&1 | grep -E "^backward" | tail -1
        grep -o '"variant": *"[^"]*"' "$res/sweep-$n.json" | cut -c12-; }
    for round in 1 2; do
        one 16/32 GDN_BWD_CHAINS=auto; one 16/32 GDN_BWD_CHAINS=apart; one 16/32 GDN_BWD_CHAINS=serial
        one 16/32 GDN_BWD_SEGMENT_CHUNKS=128; one 16/32 GDN_BWD_PAIRS=0
        one 2/8 GDN_BWD_CHAINS=auto; one 2/8 GDN_BWD_SEGMENT_CHUNKS=32; one 2/8 GDN_BWD_SEGMENT_CHUNKS=128
        one 2/8 GDN_BWD_CHAINS=apart
        one 16/64 GDN_BWD_CHAINS=auto; one 16/64 GDN_BWD_PAIRS=1 GDN_V_BLOCK=32; one 16/64 GDN_BWD_CHAINS=serial
    done; }
for stage in "${@:-fla tests compare bench decode}"; do for s in $stage; do "$s"; done; done
stamp done
tar -cJf /tmp/all.tar.xz -C "$res" . && mv /tmp/all.tar.xz "$OUT/"
