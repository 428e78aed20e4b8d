#!/usr/bin/env bash
# Side by side on the GPU machine: our prebuilt `gdn` (carried in .carry/gdn) against FLA's
# Triton kernels (installed from .whl/), same shapes, one table, plus a numerics cross-check on
# identical inputs. See benches/compare/README.md for the steps that prepare .carry, .whl, .gl.
#
#   bash benches/compare/run.sh [all|ours|ours-bf16|ours-cuda|fla|xcheck|report|ours-backward|ours-cuda-backward]...
#
# all = ours ours-bf16 [ours-cuda when $GDN was built with the `cuda` feature] fla xcheck report
# (default). ours: the WGSL kernels with f32 storage; ours-bf16: the same with bf16 storage (the
# cooperative-matrix forward); ours-cuda: the CUDA kernels, bf16, timed per call from CUDA-graph
# replays as FLA is. Phases keep their results in $WORK (default /tmp/gdn-compare,
# so later calls on a still-warm machine find earlier phases' files) and copy the small ones
# (ours*.json/svg, fla.json, compare.md/json, versions.txt, run.log) to $OUT when it is set
# (the device tool's output folder). Environment: GDN (binary, default .carry/gdn), BENCH_ARGS
# (extra `gdn bench` flags, e.g. "--heads 2/8 --seqs 1x8192 --decode-batch 1" for a smoke
# run), WORK.
set -uo pipefail
cd "$(dirname "$0")/../.."
WORK=${WORK:-/tmp/gdn-compare}
OUT=${OUT:-}
GDN=${GDN:-.carry/gdn}
XCHECK_DIR=$WORK/xcheck
BENCH_ARGS=${BENCH_ARGS:-}
HERE=benches/compare
mkdir -p "$WORK"
exec > >(tee -a "$WORK/run.log") 2>&1
status=0
t0=$(date +%s)
log() { echo "== [$(( $(date +%s) - t0 ))s] $*"; }

# The Vulkan loader the GPU machine lacks (shared/tools/device/fetch-vulkan-loader.sh); only
# where the NVIDIA driver's ICD is (the prelude unpacks packages into / and points at it).
if [ -f .gl/prelude.sh ] && [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
    # shellcheck disable=SC1091
    source .gl/prelude.sh
else
    log "note: not using .gl/prelude.sh (absent, or no NVIDIA ICD here): using the installed Vulkan loader"
fi
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}

if [ ! -x "$GDN" ]; then
    echo "error: $GDN missing: build it here with the README's commands and carry .carry/gdn" >&2
    exit 2
fi

fla_ready=0
setup_fla() {
    [ "$fla_ready" = 1 ] && return 0
    if python3 -c 'import fla' 2>/dev/null; then fla_ready=1; return 0; fi
    if ! ls .whl/*.whl >/dev/null 2>&1; then
        echo "error: no FLA wheel in .whl/ (run shared/tools/device/fetch-fla.sh here and carry .whl)" >&2
        return 1
    fi
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || return 1
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    fla_ready=1
}

versions() {
    {
        echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
        "$GDN" --version
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "nvidia-smi: n/a"
        python3 -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)' 2>/dev/null || echo "torch: n/a"
        python3 -c 'import fla; print("fla", getattr(fla, "__version__", "?"))' 2>/dev/null || echo "fla: n/a"
        "$GDN" info
    } > "$WORK/versions.txt" 2>&1
    cat "$WORK/versions.txt"
}

phase_ours() {
    log "ours: gdn bench --ops forward,decode"
    # shellcheck disable=SC2086
    "$GDN" bench --ops forward,decode --max-seconds 4 --no-progress \
        --json "$WORK/ours.json" --plot "$WORK/ours.svg" $BENCH_ARGS || status=1
}

phase_ours_bf16() {
    log "ours: gdn bench --ops forward --dtype bf16 (wgpu)"
    # shellcheck disable=SC2086
    "$GDN" bench --ops forward --dtype bf16 --max-seconds 4 --no-progress \
        --json "$WORK/ours_bf16.json" $BENCH_ARGS || status=1
}

has_cuda() { "$GDN" bench --help 2>/dev/null | grep -qE '^\s*- cuda:'; }

phase_ours_cuda() {
    log "ours: gdn bench --backend cuda --ops forward,decode --dtype bf16 --cuda-graph 10"
    has_cuda || { echo "error: $GDN was built without the cuda feature" >&2; status=1; return; }
    # shellcheck disable=SC2086
    "$GDN" bench --backend cuda --ops forward,decode --dtype bf16 --cuda-graph 10 --max-seconds 4 \
        --no-progress --json "$WORK/ours_cuda.json" $BENCH_ARGS || status=1
}

phase_ours_cuda_backward() {
    log "ours: gdn bench --backend cuda --ops backward --dtype bf16"
    has_cuda || { echo "error: $GDN was built without the cuda feature" >&2; status=1; return; }
    # shellcheck disable=SC2086
    "$GDN" bench --backend cuda --ops backward --dtype bf16 --max-seconds 4 --no-progress \
        --json "$WORK/ours_cuda_backward.json" $BENCH_ARGS || status=1
}

phase_ours_backward() {
    log "ours: gdn bench --ops backward"
    # shellcheck disable=SC2086
    "$GDN" bench --ops backward --max-seconds 4 --no-progress \
        --json "$WORK/ours_backward.json" --plot "$WORK/ours_backward.svg" $BENCH_ARGS || status=1
}

phase_fla() {
    log "FLA: chunk_gated_delta_rule + fused_recurrent_gated_delta_rule (CUDA graphs)"
    setup_fla || { status=1; return; }
    ls "$WORK"/ours*.json >/dev/null 2>&1 || { echo "error: no $WORK/ours*.json: run an 'ours' phase first" >&2; status=1; return; }
    python3 "$HERE/compare.py" fla --ours "$WORK"/ours*.json --out "$WORK/fla.json" || status=1
}

phase_xcheck() {
    log "cross-check: identical fp32 inputs through FLA, an f64 reference and gdn run"
    setup_fla || { status=1; return; }
    rm -rf "$XCHECK_DIR"
    python3 "$HERE/compare.py" xcheck-inputs --dir "$XCHECK_DIR" || { status=1; return; }
    for input in "$XCHECK_DIR"/in_*.safetensors; do
        name=$(basename "$input" .safetensors); name=${name#in_}
        kernel=forward
        case "$name" in decode*) kernel=decode ;; esac
        "$GDN" run "$kernel" --backend wgpu --input "$input" --output "$XCHECK_DIR/ours_$name.safetensors" || status=1
    done
}

phase_report() {
    log "report"
    ours=()
    for f in ours ours_bf16 ours_cuda ours_backward ours_cuda_backward; do
        [ -f "$WORK/$f.json" ] && ours+=("$WORK/$f.json")
    done
    args=(report --ours "${ours[@]}" --fla "$WORK/fla.json" --out-md "$WORK/compare.md" --out-json "$WORK/compare.json")
    [ -d "$XCHECK_DIR" ] && args+=(--xcheck "$XCHECK_DIR")
    python3 "$HERE/compare.py" "${args[@]}" || status=1
}

phases=("$@")
[ ${#phases[@]} -eq 0 ] && phases=(all)
versions
for phase in "${phases[@]}"; do
    case "$phase" in
        all)
            phase_ours; phase_ours_bf16
            if has_cuda; then phase_ours_cuda; fi
            phase_fla; phase_xcheck; phase_report ;;
        ours) phase_ours ;;
        ours-bf16) phase_ours_bf16 ;;
        ours-cuda) phase_ours_cuda ;;
        ours-backward) phase_ours_backward ;;
        ours-cuda-backward) phase_ours_cuda_backward ;;
        fla) phase_fla ;;
        xcheck) phase_xcheck ;;
        report) phase_report ;;
        *) echo "error: unknown phase $phase (all ours ours-bf16 ours-cuda fla xcheck report ours-backward ours-cuda-backward)" >&2; exit 2 ;;
    esac
done
if [ -n "$OUT" ] && [ "$OUT" != "$WORK" ]; then
    mkdir -p "$OUT"
    for f in "$WORK"/*.json "$WORK"/*.svg "$WORK"/*.md "$WORK"/*.txt "$WORK"/run.log; do
        [ -f "$f" ] && cp "$f" "$OUT/"
    done
fi
log "done (status $status); results in $WORK${OUT:+ and $OUT}"
exit "$status"
