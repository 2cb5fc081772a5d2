"""specrt serve under load: decode tokens/s and time to first token at 1, 2 and 4 concurrent
clients, with and without speculation; every answer checked against plain decoding.

    python -m scripts.serve_bench artifacts/qwen2.5-coder-0.5b-instruct/int4 \\
        --prompts ../shared/data/specbench/question.jsonl --threads 2       # from the repo root

Starts the server (``specrt.serve``) in this process on a free loopback port, then for each
``--methods`` entry and each ``--clients`` count runs that many client threads, which together send
``--requests`` streamed chat requests (greedy, ``--max-tokens``; the first turns of the Spec-Bench
questions, in turn). Per request it measures the time to the first content chunk (TTFT) and the
decode rate after it ((tokens - 1) / (last chunk - first chunk)). Prints one line per (method,
clients): median TTFT, median per-request decode tokens/s, and the total emitted tokens over the
wall time (aggregate tokens/s); then whether every answer equalled the ``baseline`` answer to the
same prompt (exit status 1 when one did not). ``--json PATH`` writes the rows.

Every row starts cold: the model forgets what its drafters learned across requests (suffix
histories, ...) before each row, so no row drafts from an answer it saw in an earlier row to the same
prompt, and there is no prefix cache, so every request prefills. ``--keep-history`` keeps the
histories (repeated traffic) and ``--prefix-cache-mb M`` turns the prefix cache on.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import specrt
from pipeline.lib.specbench import read_questions
from specrt.drafters import DEFAULT_METHOD


@dataclass(frozen=True)
class Timing:
    prompt: int  # index into the prompts
    ttft_s: float  # request sent -> first content chunk
    decode_tokens_per_s: float  # (tokens - 1) / (last chunk - first chunk); 0 for a one-token answer
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class Row:
    method: str
    clients: int
    requests: int
    median_ttft_s: float
    median_decode_tokens_per_s: float
    aggregate_tokens_per_s: float  # every request's tokens over the wall time of the run


def start_server(model: specrt.SpecModel, max_concurrent: int):
    """The server on ``model`` in a thread of this process (a ``specrt.serve.LocalServer``)."""
    from specrt.serve import ServeConfig, Speculation, build_app, serve_in_thread

    config = ServeConfig(model_id=model.manifest.name, max_concurrent=max_concurrent,
                         speculation=Speculation(DEFAULT_METHOD, tree=False, draft_budget=8))
    return serve_in_thread(build_app(model, config))


def one_request(port: int, prompt: str, method: str, tree: bool, max_tokens: int) -> tuple[float, float, tuple]:
    """(ttft_s, decode tokens/s, token ids) of one streamed chat request."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "specrt": {"method": method, "tree": tree}}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {response.read()[:200]!r}")
    first = last = None
    token_ids: tuple = ()
    for line in response:
        if not line.startswith(b"data: {"):
            continue
        event = json.loads(line[6:])
        if "error" in event:
            raise RuntimeError(event["error"]["message"])
        now = time.perf_counter()
        delta = event["choices"][0].get("delta", {}) if event["choices"] else {}
        if delta.get("content"):
            first = now if first is None else first
            last = now
        if "specrt" in event:
            token_ids = tuple(event["specrt"]["token_ids"])
    conn.close()
    first = first if first is not None else time.perf_counter()
    last = last if last is not None else first
    rate = (len(token_ids) - 1) / (last - first) if len(token_ids) > 1 and last > first else 0.0
    return first - t0, rate, token_ids


def run(port: int, prompts: list[str], method: str, tree: bool, clients: int, requests: int,
        max_tokens: int) -> tuple[Row, list[Timing]]:
    timings: list[Timing] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def client(k: int) -> None:
        try:
            for i in range(k, requests, clients):
                ttft, rate, ids = one_request(port, prompts[i % len(prompts)], method, tree, max_tokens)
                with lock:
                    timings.append(Timing(i % len(prompts), ttft, rate, ids))
        except BaseException as e:  # reported by the caller
            errors.append(e)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{method} with {clients} clients: {errors[0]}")
    row = Row(method=method + (" tree" if tree else ""), clients=clients, requests=requests,
              median_ttft_s=round(statistics.median(t.ttft_s for t in timings), 4),
              median_decode_tokens_per_s=round(statistics.median(t.decode_tokens_per_s for t in timings), 2),
              aggregate_tokens_per_s=round(sum(len(t.token_ids) for t in timings) / wall, 2))
    return row, timings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--prompts", type=Path, required=True, help="Spec-Bench question.jsonl")
    parser.add_argument("--methods", default=f"baseline,{DEFAULT_METHOD}",
                        help="comma-separated; 'NAME:tree' verifies trees (baseline first: the reference answers)")
    parser.add_argument("--clients", default="1,2,4", help="comma-separated concurrent client counts")
    parser.add_argument("--requests", type=int, default=8, help="requests per (method, clients)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, help="onnxruntime intra-op threads")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--keep-history", action="store_true",
                        help="keep drafters' cross-request histories from row to row (repeated traffic)")
    parser.add_argument("--prefix-cache-mb", type=float, default=0, help="prefix cache size (0: none, the default)")
    args = parser.parse_args(argv)

    methods = [(m.split(":")[0], m.endswith(":tree")) for m in args.methods.split(",")]
    clients = [int(c) for c in args.clients.split(",")]
    if methods[0] != ("baseline", False):
        parser.error("--methods must start with baseline (the reference answers)")
    prompts = [q.turns[0] for q in read_questions(args.prompts)]
    model = specrt.load(args.model, threads=args.threads, prefix_cache_mb=args.prefix_cache_mb)
    local = start_server(model, max_concurrent=max(clients))
    port = local.port
    rows, same = [], True
    reference: dict[int, tuple] = {}
    try:
        for method, tree in methods:
            for n in clients:
                if not args.keep_history:
                    model.forget_history()
                row, timings = run(port, prompts, method, tree, n, args.requests, args.max_tokens)
                rows.append(row)
                for t in timings:
                    same &= reference.setdefault(t.prompt, t.token_ids) == t.token_ids
                print(f"{row.method:<20} {n} clients: TTFT {row.median_ttft_s:.3f} s, decode "
                      f"{row.median_decode_tokens_per_s:.1f} tok/s per request, {row.aggregate_tokens_per_s:.1f} "
                      f"tok/s in all ({row.requests} requests)", flush=True)
    finally:
        local.stop(timeout_s=60)
    print(f"answers equal to baseline: {same}")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
