#!/usr/bin/env bash
# The GPU rows of BENCHMARKS.md (issue 41, item 6) in one prepared run of a few minutes,
# for a session that is lent a GPU machine. Writes everything to ${OUT:-gpu_suite_out}/.
#
#   bash benchmarks/gpu_suite.sh            # from the repository root, venv installed
#
# 1. the card (nvidia-smi); 2. the roofline on the GPU (benchmarks/decode_roofline.py
# --device cuda: a STREAM-style triad on the device, then SmolLM2-135M's shape, GPT-2-small's,
# ImageGPT and Whisper's decoder in fp32 / bf16, eager and bf16 compiled with CUDA graphs,
# as shares of the bandwidth limit); 3. ViT-B/16 bf16 training MFU (benchmarks/mfu.py,
# eager and compiled, and timm's ViT-B/16 through the same step); 4. compiled GPT-2
# decoding against transformers (benchmarks/generation_speed.py --compile on cuda). Each step has its own time limit so
# one slow step cannot eat the rest; a failed step is recorded and the next one runs.
# Needs torch, transformers and einops (the GPU image has them); about 10 minutes at most.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PY:-.venv/bin/python}"
[[ -x "$PY" ]] || PY=python3
OUT="${OUT:-gpu_suite_out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

step() {  # step NAME SECONDS CMD...
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit}s)" | tee -a "$OUT/summary.txt"
    if timeout "$limit" "$@" >"$OUT/$name.txt" 2>&1; then
        tail -n 25 "$OUT/$name.txt" | tee -a "$OUT/summary.txt"
    else
        echo "FAILED or timed out (rc $?): see $OUT/$name.txt" | tee -a "$OUT/summary.txt"
        tail -n 5 "$OUT/$name.txt" >>"$OUT/summary.txt"
    fi
}

step card 30 nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv
step roofline 200 "$PY" benchmarks/decode_roofline.py --device cuda --compile --repeats 3
step mfu_eager 60 "$PY" benchmarks/mfu.py --batch 128 --no-compile --warmup 5 --steps 20
step mfu 120 "$PY" benchmarks/mfu.py --batch 128
step mfu_timm 100 "$PY" benchmarks/mfu.py --batch 128 --model timm
step decode 80 "$PY" benchmarks/generation_speed.py --device cuda --compile --batch 1 \
    --beams 1 --repeats 3
echo "done: $OUT/summary.txt"
