"""Prompt KV reuse across requests: a request whose prompt begins like an earlier one's skips
the prefill passes that would compute the same rows again.

A prefill runs the prompt in passes of ``chunk`` positions: ``[0, c)``, ``[c, 2c)``, ... and a
last partial pass. After a request's prefill, :class:`PrefixCache` keeps a host copy of its KV
rows, its hidden states and the logits of its last position (:class:`PrefixEntry`). A later
prompt reuses

    the whole entry           when it is the same prompt (same tokens, same chunk): no pass runs;
    the first k * c rows      when it shares at least k * c leading tokens (k whole passes), and
                              the prefill continues with the pass ``[k c, (k + 1) c)``.

Only whole passes are reused, so the passes that still run are exactly the passes a cold prefill
runs, on the same rows, and every reused row is the output of the same pass of a cold prefill:
a cache hit leaves the KV cache, the first token and the drafters' hidden states bit for bit as
without the cache, whatever the kernels do with windows of different sizes. Rows written by
verify passes (generated tokens) are never cached for the same reason.

Entries live in host memory, least recently used out first, up to ``max_bytes``. Thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from specrt.errors import InvalidRequestError
from specrt.sequences import common_prefix


@dataclass(frozen=True)
class PrefixEntry:
    """What one cold prefill of ``tokens`` left behind (arrays read-only)."""

    tokens: np.ndarray  # [t] int64: the prompt
    kv: np.ndarray  # [n_buffers, t, kv_heads, head_dim] float32: the cache rows of the prompt
    hidden: np.ndarray  # [t, hidden] float32: the prefill's hidden states
    last_logits: np.ndarray  # [vocab] float32: logits at the prompt's last position
    chunk: int  # prefill_chunk of the passes that computed it

    def __post_init__(self) -> None:
        t = len(self.tokens)
        if self.kv.shape[1] != t or len(self.hidden) != t:
            raise ValueError(f"PrefixEntry: {t} tokens but kv rows {self.kv.shape[1]}, hidden rows {len(self.hidden)}")
        for a in (self.tokens, self.kv, self.hidden, self.last_logits):
            a.setflags(write=False)

    @property
    def nbytes(self) -> int:
        return self.tokens.nbytes + self.kv.nbytes + self.hidden.nbytes + self.last_logits.nbytes


@dataclass(frozen=True)
class PrefixHit:
    entry: PrefixEntry
    rows: int  # leading rows of the entry to reuse: len(entry.tokens) on a whole hit, else a multiple of chunk

    @property
    def whole(self) -> bool:
        """The entry is the same prompt: its last logits give the first token, no pass runs."""
        return self.rows == len(self.entry.tokens)


class PrefixCache:
    """Least recently used :class:`PrefixEntry` s of one decoder graph, up to ``max_bytes`` in all."""

    def __init__(self, max_bytes: int):
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise InvalidRequestError(f"prefix cache size must be an int >= 0 bytes, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, bytes], PrefixEntry] = OrderedDict()  # (chunk, tokens) -> entry
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0  # lookups that reused rows
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def lookup(self, prompt: np.ndarray, chunk: int) -> PrefixHit | None:
        """The entry that saves ``prompt`` ([t] int64) the most prefill rows with passes of ``chunk``."""
        best: PrefixHit | None = None
        with self._lock:
            for entry in self._entries.values():
                if entry.chunk != chunk:
                    continue
                shared = common_prefix(entry.tokens, prompt)
                if shared == len(prompt) == len(entry.tokens):
                    best = PrefixHit(entry, shared)
                    break
                rows = min(shared, len(prompt) - 1) // chunk * chunk  # whole passes; one token left to run
                if rows and (best is None or rows > best.rows):
                    best = PrefixHit(entry, rows)
            if best is None:
                self.misses += 1
                return None
            self.hits += 1
            self._entries.move_to_end(_key(best.entry))
            return best

    def fits(self, nbytes: int) -> bool:
        """Whether an entry of ``nbytes`` could be kept (callers skip building one that could not)."""
        return nbytes <= self.max_bytes

    def insert(self, entry: PrefixEntry) -> bool:
        """Keep ``entry`` (replacing one of the same prompt and chunk), dropping the least recently
        used ones to fit; False when it alone exceeds ``max_bytes`` (nothing is dropped then)."""
        if not self.fits(entry.nbytes):
            return False
        key = _key(entry)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            while self._entries and self._bytes + entry.nbytes > self.max_bytes:
                _, dropped = self._entries.popitem(last=False)
                self._bytes -= dropped.nbytes
            self._entries[key] = entry
            self._bytes += entry.nbytes
        return True

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0


def _key(entry: PrefixEntry) -> tuple[int, bytes]:
    return entry.chunk, entry.tokens.tobytes()
