#!/usr/bin/env bash
# The GPU rows of BENCHMARKS.md in one prepared run, for a session that is lent a GPU
# machine (15-minute slots). Writes everything to ${OUT:-gpu_suite_out}/: one log per row,
# rows.jsonl (one JSON line per training row), summary.txt (every row's command and result,
# and the table of the training rows at the end).
#
#   bash benchmarks/gpu_suite.sh                  # issue 50's rows, < 9 min on one H200
#   bash benchmarks/gpu_suite.sh --full           # the same without the max_time caps
#                                                 # (the whole long run and iGPT config)
#   bash benchmarks/gpu_suite.sh --rows issue41   # the earlier rows (roofline, MFU eager /
#                                                 # compiled / timm, compiled decoding)
#   bash benchmarks/gpu_suite.sh --device cpu     # (or DEVICE=cpu) every row at small sizes
#                                                 # on this CPU: checks the script itself
#
# Rows (issue 50): card; main = configs/vit_fashion_mnist.yaml as shipped (accelerator
# auto: test accuracy, training seconds, `nvidia-smi dmon` SM busy in the background);
# long = vit_fashion_mnist_long.yaml; igpt = igpt_fashion_mnist_gpu.yaml (bits/dim and
# samples); caption = caption_scenes.yaml and clip = clip_scenes.yaml with accelerator auto
# (steps/s, the held-out-pair scores); mfu = ViT-B/16 bf16 training MFU (benchmarks/mfu.py,
# compiled); smoke = every config 30 steps on the device (benchmarks/smoke_configs.py).
# Without --full the training rows carry a trainer.max_time cap so that the limits of all
# rows add up to 525 s: a capped row reports how far it got (epochs, steps/s, the test of
# its best checkpoint) and says "stopped by max_time"; --full runs the configs whole.
# Each row has its own `timeout`; a failed row is recorded and the next one runs. Each
# training row writes its run (checkpoints, logs, samples) to $OUT/runs/<row>; on the
# device machine run it as `OUT=$OUT bash benchmarks/gpu_suite.sh` so that they come back.
#
# The GPU image has torch, lightning, timm and transformers but no jsonargparse (the CLI
# needs it). On the CPU machine, `bash benchmarks/gpu_suite.sh --pack` copies jsonargparse,
# docstring_parser and typeshed_client (pure Python, with their metadata) from this venv
# into .whl/site/ (git-ignored: name ".whl" in the device run's carry); any *.whl files in
# .whl/ are installed with pip --no-index. The suite puts .whl/site on PYTHONPATH.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PY:-.venv/bin/python}"
[[ -x "$PY" ]] || PY=python3
OUT="${OUT:-gpu_suite_out}"
DEVICE="${DEVICE:-auto}"
ROWS="${ROWS:-issue50}"
FULL="${FULL:-0}"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --device) DEVICE=$2; shift 2 ;;
        --device=*) DEVICE=${1#*=}; shift ;;
        --rows) ROWS=$2; shift 2 ;;
        --full) FULL=1; shift ;;
        --out) OUT=$2; shift 2 ;;
        --pack)
            mkdir -p .whl/site
            "$PY" - <<'EOF'
import importlib.metadata as md, shutil, pathlib
dest = pathlib.Path(".whl/site")
for name in ("jsonargparse", "docstring_parser", "typeshed_client"):
    dist = md.distribution(name)
    for f in dist.files or []:
        src = pathlib.Path(dist.locate_file(f))
        if src.is_file() and "__pycache__" not in f.parts and not str(f).startswith(".."):
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)
    print(f"packed {name} {dist.version}")
EOF
            exit $? ;;
        *) echo "error: unknown option $1 (--device cpu|auto, --rows issue50|issue41|all, --full, --pack)" >&2
           exit 2 ;;
    esac
done
mkdir -p "$OUT"
: >"$OUT/summary.txt"
: >"$OUT/rows.jsonl"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
[[ -d .whl/site ]] && export PYTHONPATH="$PWD/.whl/site:$PYTHONPATH"
if ! "$PY" -c "import jsonargparse" 2>/dev/null && compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --find-links .whl .whl/*.whl
fi
SUITE_START=$(date +%s)

step() {  # step NAME SECONDS CMD...: the command, its limit and its result in summary.txt
    local name=$1 limit=$2 rc start
    shift 2
    start=$(date +%s)
    { echo "== $name (limit ${limit}s)"; echo "\$ $*"; } | tee -a "$OUT/summary.txt"
    timeout "$limit" "$@" >"$OUT/$name.txt" 2>&1
    rc=$?
    if [[ $rc -eq 0 ]]; then
        grep -v "^ROW " "$OUT/$name.txt" | tail -n 12 | tee -a "$OUT/summary.txt"
    else
        echo "FAILED or timed out (rc $rc): see $OUT/$name.txt" | tee -a "$OUT/summary.txt"
        tail -n 5 "$OUT/$name.txt" >>"$OUT/summary.txt"
    fi
    echo "-- $name: $(( $(date +%s) - start )) s" | tee -a "$OUT/summary.txt"
}

fit_row() {  # fit_row NAME SECONDS fit ARGS...: benchmarks/fit_row.py (timed, one JSON row)
    local name=$1 limit=$2
    shift 2
    step "$name" "$limit" "$PY" benchmarks/fit_row.py --name "$name" --out "$OUT/rows.jsonl" -- \
        "$@" --trainer.default_root_dir "$OUT/runs/$name"
}

if [[ "$DEVICE" == cpu ]]; then
    # small sizes: a few steps of each row, to check the script and every command in it
    ACC=(--trainer.accelerator cpu --trainer.max_time null --trainer.limit_val_batches 2
         --trainer.limit_test_batches 2 --trainer.num_sanity_val_steps 0)
    MAIN=("${ACC[@]}" --trainer.max_steps 20 --trainer.max_epochs -1)
    LONG=("${ACC[@]}" --trainer.max_steps 10 --trainer.max_epochs -1)
    IGPT=("${ACC[@]}" --trainer.max_steps 3 --trainer.max_epochs -1 --data.init_args.batch_size 4
          --model.init_args.num_samples 1 --trainer.precision bf16-mixed)
    PAIRS=("${ACC[@]}" --trainer.max_steps 10 --trainer.max_epochs -1)
    LIMIT=900; SMOKE=(--device cpu --steps 2 --gpu-like --jobs 2 --threads 1 --timeout 600)
    SMOKE_LIMIT=3000
    MFU=(--dry-run)
else
    ACC=(--trainer.accelerator auto)
    cap() { [[ "$FULL" == 1 ]] && return; echo "--trainer.max_time 00:00:00:$1"; }
    # shellcheck disable=SC2046
    MAIN=("${ACC[@]}" $( [[ "$FULL" == 1 ]] || echo --trainer.max_time 00:00:01:30 ))
    LONG=("${ACC[@]}" $(cap 60))
    IGPT=("${ACC[@]}" $(cap 45))
    PAIRS=("${ACC[@]}" --trainer.max_epochs 2 $(cap 25))
    LIMIT=0; SMOKE=(--steps 30 --jobs 4 --timeout 80); SMOKE_LIMIT=90
    MFU=(--batch 128 --warmup 5 --steps 15)
fi
lim() { [[ $LIMIT -gt 0 ]] && echo "$LIMIT" || echo "$1"; }

if [[ "$ROWS" == issue50 || "$ROWS" == all ]]; then
    if command -v nvidia-smi >/dev/null; then
        step card 10 nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv
        nvidia-smi dmon -s u -d 1 >"$OUT/main_dmon.txt" 2>&1 &
        DMON=$!
    else
        step card 30 "$PY" -c "import sys; sys.path.insert(0, 'benchmarks'); from machine import machine_header; print(machine_header())"
        DMON=
    fi
    fit_row main "$(lim 120)" fit --config configs/vit_fashion_mnist.yaml "${MAIN[@]}"
    if [[ -n "$DMON" ]]; then
        kill "$DMON" 2>/dev/null
        "$PY" - "$OUT/main_dmon.txt" <<'EOF' | tee -a "$OUT/summary.txt"
import sys
sm = []
for line in open(sys.argv[1]):
    parts = line.split()
    if parts and parts[0].isdigit() and len(parts) > 1 and parts[1].isdigit():
        sm.append(int(parts[1]))
busy = [s for s in sm if s > 0]
if sm:
    print(f"main: GPU SM busy (nvidia-smi dmon, 1 s samples): mean {sum(sm) / len(sm):.0f} % "
          f"over {len(sm)} s, {sum(busy) / max(len(busy), 1):.0f} % over the {len(busy)} busy s")
EOF
    fi
    fit_row long "$(lim 85)" fit --config configs/vit_fashion_mnist_long.yaml "${LONG[@]}"
    fit_row igpt "$(lim 70)" fit --config configs/igpt_fashion_mnist_gpu.yaml "${IGPT[@]}"
    fit_row caption "$(lim 45)" fit --config configs/caption_scenes.yaml "${PAIRS[@]}"
    fit_row clip "$(lim 45)" fit --config configs/clip_scenes.yaml "${PAIRS[@]}"
    step mfu "$(lim 60)" "$PY" benchmarks/mfu.py "${MFU[@]}"
    step smoke "$SMOKE_LIMIT" "$PY" benchmarks/smoke_configs.py --out "$OUT/smoke" "${SMOKE[@]}"
fi
if [[ "$ROWS" == issue41 || "$ROWS" == all ]]; then
    step roofline 200 "$PY" benchmarks/decode_roofline.py --device cuda --compile --repeats 3
    step mfu_eager 60 "$PY" benchmarks/mfu.py --batch 128 --no-compile --warmup 5 --steps 20
    step mfu_compiled 120 "$PY" benchmarks/mfu.py --batch 128
    step mfu_timm 100 "$PY" benchmarks/mfu.py --batch 128 --model timm
    step decode 80 "$PY" benchmarks/generation_speed.py --device cuda --compile --batch 1 \
        --beams 1 --repeats 3
fi
{
    echo
    echo "== training rows (device $DEVICE, full $FULL)"
    "$PY" benchmarks/fit_row.py --summarise "$OUT/rows.jsonl"
    echo
    echo "suite: $(( $(date +%s) - SUITE_START )) s"
} | tee -a "$OUT/summary.txt"
echo "done: $OUT/summary.txt"
