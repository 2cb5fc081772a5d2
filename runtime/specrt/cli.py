"""``specrt generate``: complete a prompt from the command line; ``specrt check``: is speculation
lossless with this artifact here? ``specrt serve``: an OpenAI-compatible HTTP server.

    specrt generate --model artifacts/qwen2.5-coder-0.5b-instruct/fp32 --method pld "def add(a, b):"
    specrt generate --model artifacts/vlm/fp32 --image cat.png --chat "What is in this picture?"
    specrt check --model artifacts/qwen2.5-coder-0.5b-instruct/int4 [--provider cuda]
    specrt serve --model artifacts/qwen2.5-coder-0.5b-instruct/int4 --port 8000

``generate``: the completion goes to stdout; speed and acceptance go to stderr (or everything as
JSON with ``--json``). ``check``: the spec-safety verdict for this machine and provider
(:meth:`specrt.model.SpecModel.spec_safety`: the manifest's where its basis covers them, else the
self-check, run and cached now) as JSON; exit 0 when spec-safe, 1 when not. ``serve``: needs the
``serve`` extra (starlette, uvicorn), imported only by this command (:mod:`specrt.serve`).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from dataclasses import asdict
from pathlib import Path

from specrt.chat import messages
from specrt.drafters import DEFAULT_METHOD, METHODS
from specrt.drafters.indexes.datastore import MANIFEST_NAME as DATASTORE_MANIFEST
from specrt.errors import InvalidRequestError, SpecrtError
from specrt.model import BACKENDS, TextStream, load


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specrt", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="complete a prompt")
    gen.add_argument("prompt", nargs="?", default=None,
                     help="prompt text ('-' reads it from stdin); with --system/--messages, the last user turn")
    gen.add_argument("--model", required=True, help="artifact folder, e.g. artifacts/<model>/fp32")
    gen.add_argument("--method", default=DEFAULT_METHOD,
                     help=f"drafting method (default auto: the best draft per step): {', '.join(sorted(METHODS))}")
    gen.add_argument("--tree", action="store_true", help="verify a draft tree instead of a chain")
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--draft-budget", type=int, default=8, help="draft-tree nodes per verify step")
    gen.add_argument("--no-backoff", dest="backoff", action="store_false", default=None,
                     help="verify every draft, even while drafts do not pay for their window (default: back off)")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template (one user turn)")
    gen.add_argument("--system", default=None,
                     help="a system prompt: the prompt becomes chat messages rendered by the model's Jinja chat "
                     "template (needs the 'chat' extra)")
    gen.add_argument("--messages", type=Path, default=None,
                     help="a JSON file of earlier chat messages ([{\"role\", \"content\"}, ...]); the prompt, if "
                     "given, is appended as the last user turn (needs the 'chat' extra)")
    gen.add_argument(
        "--datastore",
        default=None,
        help="retrieval datastore folder for rest, sam_decoding, asam*, auto (default: the model folder's sibling "
        "'datastore' when the pipeline built one)",
    )
    gen.add_argument("--threads", type=int, default=None, help="onnxruntime intra-op threads")
    gen.add_argument("--skip-hash-check", dest="check_hashes", action="store_false",
                     help="do not check the artifact files' sha256 (sizes still are); an unchanged folder "
                     "is hashed only once anyway (a verified stamp in ~/.cache/specrt)")
    gen.add_argument("--provider", default="cpu",
                     help="execution provider: cpu, or cuda (needs onnxruntime-gpu; README, 'CUDA')")
    gen.add_argument("--draft", default=None, help="draft model artifact folder, for --method sd, hsd, hsd_capped "
                     "or auto (same tokenizer as --model)")
    _backend_options(gen)
    gen.add_argument("--image", dest="images", action="append", type=Path, default=[], metavar="PATH",
                     help="an image for a vision-language artifact (repeat for several): it takes the place of the "
                     "prompt's n-th <image>, or goes before the prompt when it names none")
    gen.add_argument("--stream", action="store_true", help="print text as it is accepted")
    gen.add_argument("--json", action="store_true", help="print the result and stats as one JSON object")
    check = sub.add_parser("check", help="whether speculation is lossless with this artifact on this machine")
    check.add_argument("--model", required=True, help="artifact folder, e.g. artifacts/<model>/int4")
    check.add_argument("--threads", type=int, default=None, help="onnxruntime intra-op threads")
    check.add_argument("--skip-hash-check", dest="check_hashes", action="store_false",
                     help="do not check the artifact files' sha256 (sizes still are); an unchanged folder "
                     "is hashed only once anyway (a verified stamp in ~/.cache/specrt)")
    check.add_argument("--provider", default="cpu", help="execution provider: cpu or cuda")
    _backend_options(check)
    serve = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (needs the 'serve' extra)")
    serve.add_argument("--model", required=True, help="artifact folder, e.g. artifacts/<model>/int4")
    serve.add_argument("--draft", default=None, help="draft model artifact folder, for sd, hsd, hsd_capped")
    serve.add_argument("--datastore", default=None, help="retrieval datastore folder (default: as generate)")
    serve.add_argument("--method", default=DEFAULT_METHOD,
                       help=f"the default drafting method of requests (default {DEFAULT_METHOD})")
    serve.add_argument("--tree", action="store_true", help="requests verify draft trees by default")
    serve.add_argument("--draft-budget", type=int, default=8, help="default draft-tree nodes per verify step")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--max-concurrent", type=int, default=4,
                       help="generations running at once; more are answered 429 with Retry-After")
    serve.add_argument("--threads", type=int, default=None, help="onnxruntime intra-op threads")
    serve.add_argument("--skip-hash-check", dest="check_hashes", action="store_false",
                     help="do not check the artifact files' sha256 (sizes still are); an unchanged folder "
                     "is hashed only once anyway (a verified stamp in ~/.cache/specrt)")
    serve.add_argument("--provider", default="cpu", help="execution provider: cpu or cuda")
    _backend_options(serve)
    serve.add_argument("--prefix-cache-mb", type=float, default=256,
                       help="host memory for recent prompts' KV rows (0: off); chat turns reuse their prefill")
    serve.add_argument("--request-timeout-s", type=float, default=None,
                       help="the deadline of a request whose body sets no specrt.timeout_s, in seconds from its "
                       "start (prefill included); the answer then ends with finish_reason 'timeout' (default: none)")
    return parser


def _backend_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", default="onnxruntime", choices=BACKENDS,
                        help="onnxruntime: an exported artifact folder; hf: a Hugging Face causal-LM folder run by "
                        "transformers, no export (the hf extra)")
    parser.add_argument("--device", default="cpu", help="--backend hf: cpu or cuda")


def _datastore(model: str, datastore: str | None) -> str | Path | None:
    """``datastore``, or the model folder's sibling 'datastore' when the pipeline built one."""
    sibling = Path(model).parent / "datastore"
    if datastore is None and (sibling / DATASTORE_MANIFEST).is_file():
        return sibling
    return datastore


def _serve(args: argparse.Namespace) -> None:
    try:
        import uvicorn

        from specrt.serve import ServeConfig, Speculation, build_app
    except ImportError as e:
        raise InvalidRequestError(f"specrt serve needs the 'serve' extra (pip install 'specrt[serve]'): {e}") from None
    if args.method not in METHODS:
        raise InvalidRequestError(f"unknown method {args.method!r}; valid methods: {', '.join(sorted(METHODS))}")
    limit = args.request_timeout_s
    if limit is not None and not (math.isfinite(limit) and limit > 0):
        raise InvalidRequestError(f"--request-timeout-s must be a positive finite number of seconds, got {limit:g}")
    model = load(args.model, provider=args.provider, threads=args.threads, datastore=_datastore(args.model,
                 args.datastore), draft=args.draft, check_hashes=args.check_hashes, backend=args.backend,
                 device=args.device, prefix_cache_mb=args.prefix_cache_mb if args.backend == "onnxruntime" else 0)
    speculation = Speculation(method=args.method, tree=args.tree, draft_budget=args.draft_budget)
    config = ServeConfig(model_id=model.manifest.name, speculation=speculation, max_concurrent=args.max_concurrent,
                         request_timeout_s=limit)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(name)s: %(message)s")  # as uvicorn's lines
    uvicorn.run(build_app(model, config), host=args.host, port=args.port, log_level="info")


def _check(args: argparse.Namespace) -> bool:
    verdict = load(args.model, provider=args.provider, threads=args.threads, check_hashes=args.check_hashes,
                   backend=args.backend, device=args.device).spec_safety()
    print(json.dumps(asdict(verdict), indent=2))
    return verdict.spec_safe


def _read_prompt(arg: str) -> str:
    """The prompt argument, or stdin for '-'. Bytes that are not UTF-8 reach the model as lone
    surrogates (argv) or fail to decode (stdin): both end as an InvalidRequestError, not a traceback."""
    if arg != "-":
        return arg
    try:
        return sys.stdin.read()
    except UnicodeDecodeError as e:
        raise InvalidRequestError(f"stdin is not valid {e.encoding} text: byte {e.start} ({e.reason})") from None


def _messages(args: argparse.Namespace, prompt: str | None) -> list[dict]:
    """The chat messages of --system, --messages and the prompt (the last user turn)."""
    msgs: list = [] if args.system is None else [{"role": "system", "content": args.system}]
    if args.messages is not None:
        try:
            history = json.loads(args.messages.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise InvalidRequestError(f"{args.messages}: not a readable JSON file ({e})") from None
        try:
            msgs += [{"role": m.role, "content": m.content} for m in messages(history)]
        except InvalidRequestError as e:
            raise InvalidRequestError(f"{args.messages}: {e}") from None
    if prompt is not None:
        msgs.append({"role": "user", "content": prompt})
    return msgs


def _generate(args: argparse.Namespace) -> None:
    if args.prompt is None and args.messages is None:
        raise InvalidRequestError("generate needs a prompt, or --messages FILE")
    prompt = None if args.prompt is None else _read_prompt(args.prompt)
    chat_messages = _messages(args, prompt) if args.system is not None or args.messages is not None else None
    datastore = _datastore(args.model, args.datastore)
    model = load(args.model, provider=args.provider, threads=args.threads, datastore=datastore, draft=args.draft,
                 check_hashes=args.check_hashes, backend=args.backend, device=args.device)
    options = dict(
        max_new_tokens=args.max_new_tokens, method=args.method, tree=args.tree, temperature=args.temperature,
        top_k=args.top_k, top_p=args.top_p, seed=args.seed, draft_budget=args.draft_budget,
        backoff=args.backoff,
    )
    if args.images:
        if chat_messages or prompt is None:
            raise InvalidRequestError("--image goes with a prompt (and --chat), not with --system or --messages")
        prompt_ids, options["images"] = model.encode_images(prompt, args.images, chat=args.chat)
    else:
        prompt_ids = model.encode_chat(chat_messages) if chat_messages else model.encode(prompt, chat=args.chat)
    if args.stream and not args.json:
        loop, chunks = model.stream_ids(prompt_ids, **options)
        text = TextStream(model.tokenizer)
        for chunk in chunks:
            print(text.push(chunk), end="", flush=True)
        print(text.finish())
        _print_stats(args.method, args.tree, loop.finish_reason or "length", loop.stats.as_dict())
        return
    result = model.generate_result(prompt_ids, **options)
    if args.json:
        print(json.dumps(asdict(result), indent=2))
        return
    print(result.text)
    _print_stats(result.method, result.tree, result.finish_reason, result.stats)


def _print_stats(method: str, tree: bool, finish_reason: str, s: dict) -> None:
    print(
        f"[{method}{' tree' if tree else ''}] {s['new_tokens']} tokens ({finish_reason}); "
        f"decode {s['decode_tokens_per_s']:.1f} tok/s; "
        f"tokens/step {s['mean_tokens_per_step']:.2f} ({s['mean_accepted_drafts_per_step']:.2f} accepted drafts); "
        f"prefill {s['prompt_tokens']} tokens in {s['prefill_s'] * 1000:.0f} ms",
        file=sys.stderr,
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "generate":
            _generate(args)
        elif args.command == "check":
            return 0 if _check(args) else 1
        elif args.command == "serve":
            _serve(args)
    except SpecrtError as e:
        print(f"specrt: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("specrt: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
