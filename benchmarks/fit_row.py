"""One row of ``benchmarks/gpu_suite.sh``: ``multimodal fit ARGS`` in this process, timed,
and one JSON line appended to ``--out`` with what the row reports.

    python benchmarks/fit_row.py --name main --out rows.jsonl -- \\
        fit --config configs/vit_fashion_mnist.yaml

The row: the command, its exit status, the device, training seconds (the fit loop from
its first to its last training batch, validation included), optimiser steps, steps/s,
the median step (one training batch start to the next, within an epoch), epochs done,
whether ``trainer.max_time`` stopped it, the test metrics (the test after fit) and the
sample images the run wrote. ``--summarise rows.jsonl`` prints the rows as a table.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

KEYS = ("test/acc", "test/acc_macro", "test/bpd", "test/exact_match", "test/scene_match",
        "test/bleu4", "test/loss")


def run(name: str, argv: list[str]) -> dict[str, Any]:
    import lightning as L
    import torch

    from multimodal.cli.main import MultimodalCLI, run_lightning

    marks: dict[str, Any] = {"batches": [], "trainers": []}

    class StepClock(L.Callback):
        def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
            now = time.perf_counter()
            marks.setdefault("first", now)
            marks["batches"].append((trainer.current_epoch, now))

        def on_train_batch_end(self, *args: Any) -> None:
            marks["last"] = time.perf_counter()

    original = MultimodalCLI.instantiate_trainer

    def timed(self: Any, **kwargs: Any) -> Any:
        trainer = original(self, **kwargs)
        trainer.callbacks.append(StepClock())
        marks["trainers"].append(trainer)
        return trainer

    MultimodalCLI.instantiate_trainer = timed  # type: ignore[method-assign]
    row: dict[str, Any] = {"name": name, "command": "multimodal " + shlex.join(argv)}
    row["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    start = time.perf_counter()
    try:
        run_lightning(list(argv))
        row["rc"] = 0
    except SystemExit as e:
        row["rc"] = e.code if isinstance(e.code, int) else 1
    except Exception as e:  # the row records it; the suite goes on
        row["rc"], row["error"] = 1, f"{type(e).__name__}: {e}"[:500]
        traceback.print_exc()
    row["wall_seconds"] = round(time.perf_counter() - start, 1)
    if marks["trainers"]:
        trainer = marks["trainers"][0]
        steps = int(trainer.global_step)
        seconds = marks.get("last", 0.0) - marks.get("first", 0.0)
        gaps = [b - a for (ea, a), (eb, b) in zip(marks["batches"], marks["batches"][1:],
                                                  strict=False) if ea == eb]
        row.update(training_seconds=round(seconds, 2), steps=steps,
                   steps_per_s=round(steps / seconds, 2) if seconds > 0 else None,
                   median_step_ms=round(1e3 * statistics.median(gaps), 2) if gaps else None,
                   epochs=int(trainer.current_epoch),
                   stopped_by_max_time=_timed_out(trainer))
        root = Path(trainer.default_root_dir)
        row["samples"] = sorted(str(p) for p in root.rglob("*sample*.png"))[:5]
    if len(marks["trainers"]) > 0:
        metrics = marks["trainers"][-1].callback_metrics
        row["test"] = {k: round(float(v), 4) for k, v in metrics.items()
                       if k.startswith("test/") and getattr(v, "numel", lambda: 1)() == 1}
    return row


def _timed_out(trainer: Any) -> bool:
    timer = next((c for c in trainer.callbacks if type(c).__name__ == "Timer"
                  and hasattr(c, "time_remaining")), None)
    try:
        return bool(timer is not None and timer.time_remaining() <= 0)
    except Exception:
        return False


def summarise(path: Path) -> str:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    lines = ["| row | rc | device | training s | steps | steps/s | step ms | epochs "
             "| test | command |", "|" + " --- |" * 10]
    for r in rows:
        test = ", ".join(f"{k.split('/', 1)[1]} {v:.4g}" for k, v in
                         sorted((r.get("test") or {}).items()) if k in KEYS) or "-"
        if r.get("stopped_by_max_time"):
            test += " (stopped by max_time)"
        lines.append(f"| {r['name']} | {r.get('rc')} | {r.get('device')} | "
                     f"{r.get('training_seconds', '-')} | {r.get('steps', '-')} | "
                     f"{r.get('steps_per_s', '-')} | {r.get('median_step_ms', '-')} | "
                     f"{r.get('epochs', '-')} | {test} | `{r['command']}` |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", default="fit")
    parser.add_argument("--out", type=Path, default=None, help="append the row (JSON lines)")
    parser.add_argument("--summarise", type=Path, default=None, metavar="ROWS")
    parser.add_argument("argv", nargs=argparse.REMAINDER, help="-- fit --config ...")
    args = parser.parse_args()
    if args.summarise is not None:
        print(summarise(args.summarise))
        return
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    row = run(args.name, argv)
    print("ROW " + json.dumps(row), flush=True)
    if args.out is not None:
        with args.out.open("a") as f:
            f.write(json.dumps(row) + "\n")
    sys.exit(0 if row.get("rc") == 0 else 1)


if __name__ == "__main__":
    main()
