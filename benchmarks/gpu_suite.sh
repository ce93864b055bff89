#!/usr/bin/env bash
# The GPU rows of BENCHMARKS.md (issue 41, item 6) in one prepared run of a few minutes,
# for a session that is lent a GPU machine. Writes everything to ${OUT:-gpu_suite_out}/.
#
#   bash benchmarks/gpu_suite.sh            # from the repository root, venv installed
#
# 1. the card (nvidia-smi), 2. the device's memory bandwidth (a STREAM-style triad in torch
# on the GPU, the same count as benchmarks/decode_roofline.py), 3. ViT-B/16 bf16 training
# MFU (benchmarks/mfu.py), 4. compiled decoding tokens/s (benchmarks/generation_speed.py
# --compile on cuda). Each step has its own time limit so one slow step cannot eat the
# rest; a failed step is recorded and the next one runs.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PY:-.venv/bin/python}"
[[ -x "$PY" ]] || PY=python3
OUT="${OUT:-gpu_suite_out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

step() {  # step NAME SECONDS CMD...
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit}s)" | tee -a "$OUT/summary.txt"
    if timeout "$limit" "$@" >"$OUT/$name.txt" 2>&1; then
        tail -n 15 "$OUT/$name.txt" | tee -a "$OUT/summary.txt"
    else
        echo "FAILED or timed out (rc $?): see $OUT/$name.txt" | tee -a "$OUT/summary.txt"
        tail -n 5 "$OUT/$name.txt" >>"$OUT/summary.txt"
    fi
}

step card 30 nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv
step triad 60 "$PY" - <<'PYEOF'
import torch
assert torch.cuda.is_available(), "no CUDA device"
n = 256 * 2**20  # 1 GiB float32 arrays
b, c, a = (torch.rand(n, device="cuda") for _ in range(3))
for _ in range(3):
    torch.add(b, c, alpha=3.0, out=a)
torch.cuda.synchronize()
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
best = float("inf")
for _ in range(10):
    start.record(); torch.add(b, c, alpha=3.0, out=a); end.record(); torch.cuda.synchronize()
    best = min(best, start.elapsed_time(end) / 1e3)
print(f"{torch.cuda.get_device_name()}: triad {3 * n * 4 / best / 1e9:.0f} GB/s (1 GiB arrays)")
PYEOF
step mfu 240 "$PY" benchmarks/mfu.py --batch 128
step decode 180 "$PY" benchmarks/generation_speed.py --device cuda --compile --batch 1 \
    --beams 1 --repeats 3
echo "done: $OUT/summary.txt"
