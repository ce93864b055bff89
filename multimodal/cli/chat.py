"""``multimodal chat``: talk to a chat model (a GGUF decoder with its chat template, such as
SmolLM2-135M-Instruct) from the command line, through :func:`multimodal.chat`.

    multimodal chat --model SmolLM2-135M-Instruct "What is the capital of France?"
    multimodal chat --model model.gguf --interactive       # a conversation, turn by turn

One prompt prints the reply and exits. ``--interactive`` reads one user turn per line from
standard input and prints each reply, keeping the conversation (every turn goes back to the
model with the ones before); an empty line is skipped, ``exit`` / ``quit``, end of input or
Ctrl-C ends it. ``--temperature`` 0 (the default) is greedy decoding, the reply ``mm.chat``
gives; above 0 it samples (``--top_p``, ``--seed``).
"""

from __future__ import annotations

import sys
from typing import Any

from multimodal.cli.errors import UsageError
from multimodal.cli.flags import VerbParser, add_alias, model_path, parse

__all__ = ["main"]

QUIT = ("exit", "quit", ":q")


def _parser() -> VerbParser:
    p = VerbParser(prog="multimodal chat",
                   description="Reply to a prompt with a chat model (a GGUF file or an "
                               "installed name such as SmolLM2-135M-Instruct); --interactive "
                               "for a conversation.")
    p.add_argument("prompt", nargs="?", default=None, help="the user's message")
    p.add_argument("--model", required=True,
                   help="a .gguf chat model, or an installed model's name (multimodal models)")
    p.add_argument("--interactive", action="store_true",
                   help="a conversation: one turn per line of standard input")
    p.add_argument("--system", default=None, help="a system prompt put before the turns")
    p.add_argument("--max_new_tokens", type=int, default=256, help="longest reply, in tokens")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy; above: sampling")
    p.add_argument("--top_p", type=float, default=None, help="nucleus sampling (temperature > 0)")
    p.add_argument("--seed", type=int, default=0, help="the sampling seed")
    p.add_argument("--quantize", choices=["int8", "int4"], default=None,
                   help="weight-only quantised decoding (a GGUF file's blocks kept packed)")
    p.add_argument("--compile", action="store_true",
                   help="decode through the compiled one-token step (compiles first)")
    add_alias(p, "--max-new-tokens", "--max_new_tokens")
    add_alias(p, "--top-p", "--top_p")
    return p


def _reply(encoder: Any, messages: list[dict[str, str]], ns: Any, generator: Any) -> str:
    from multimodal.pipelines.chat import chat

    kwargs: dict[str, Any] = {"max_new_tokens": ns.max_new_tokens}
    if ns.temperature > 0:
        kwargs.update(do_sample=True, temperature=ns.temperature, top_p=ns.top_p,
                      generator=generator)
    if ns.compile:
        kwargs["compile"] = True
    return chat(encoder, messages, **kwargs)


def main(args: list[str]) -> int:
    """``multimodal chat`` (module docstring); a mistake is one ``error:`` line, exit 2."""
    ns = parse(_parser(), args)
    if ns.interactive == (ns.prompt is not None):
        raise UsageError("give one prompt, or --interactive for a conversation "
                         "(not both, not neither)", "multimodal chat --help")
    if ns.max_new_tokens < 1:
        raise UsageError(f"must be >= 1, got {ns.max_new_tokens}", "--max_new_tokens")
    if ns.temperature < 0:
        raise UsageError(f"must be >= 0, got {ns.temperature}", "--temperature")
    path = model_path(ns.model)
    import torch

    from multimodal.pipelines._loaders import served

    encoder, _ = served(path, "chat", quantize=ns.quantize)
    generator = torch.Generator().manual_seed(ns.seed)
    start = [{"role": "system", "content": ns.system}] if ns.system else []
    if not ns.interactive:
        print(_reply(encoder, [*start, {"role": "user", "content": ns.prompt}], ns, generator))
        return 0
    history = list(start)
    tty = sys.stdin.isatty()
    while True:
        try:
            line = input("you> " if tty else "")
        except (EOFError, KeyboardInterrupt):
            if tty:
                print()
            return 0
        text = line.strip()
        if not text:
            continue
        if text.lower() in QUIT:
            return 0
        turn = [*history, {"role": "user", "content": text}]
        try:
            reply = _reply(encoder, turn, ns, generator)
        except ValueError as err:  # the conversation outgrew the context: start again
            print(f"note: {err}; the conversation starts afresh", file=sys.stderr)
            turn = [*start, {"role": "user", "content": text}]
            reply = _reply(encoder, turn, ns, generator)
        except KeyboardInterrupt:
            print()
            return 0
        print(reply, flush=True)
        history = [*turn, {"role": "assistant", "content": reply}]
