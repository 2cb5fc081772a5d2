"""Suffix automata (Blumer et al. 1985) over token sequences, for SAM-Decoding (Hu et al. 2024).

A suffix automaton of a text T is the smallest automaton that accepts exactly the substrings of T.
Each state is a class of substrings with the same set of end positions; per state we keep

    length[v]     the length of its longest substring
    link[v]       its suffix link: the state of the longest suffix that lies in another class
                  (-1 at the root, state 0, which stands for the empty string)
    first_end[v]  the end position in T of the first occurrence of its substrings (-1 at the root)

and its transitions v --token--> w. Two forms share one interface (``transition``, ``link``,
``length``, ``first_end``):

* :class:`SuffixAutomaton` is built online, one token at a time (dict transitions): the live
  automaton over the prompt and everything emitted, and the pipeline's builder;
* :class:`StaticAutomaton` holds the same automaton as flat arrays with the transitions in CSR
  form (``offsets`` into ``edge_tokens``/``edge_next``, tokens sorted per state), read with a
  binary search; it is stored in a datastore and loaded memory-mapped.

Matching a stream against an automaton (:func:`advance`) keeps the state of the longest suffix of
the stream that is a substring of T: amortised O(1) transitions and suffix links per token.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Protocol

import numpy as np

ROOT = 0


class Automaton(Protocol):
    def transition(self, state: int, token: int) -> int:
        """The state reached from ``state`` by ``token``, or -1 when there is no such transition."""
        ...

    def link_of(self, state: int) -> int: ...

    def length_of(self, state: int) -> int: ...

    def first_end_of(self, state: int) -> int: ...


class SuffixAutomaton:
    """Online suffix automaton with dict transitions; ``extend`` appends one token to the text."""

    def __init__(self) -> None:
        self.length: list[int] = [0]  # [states]
        self.link: list[int] = [-1]  # [states]
        self.first_end: list[int] = [-1]  # [states]
        self.next: list[dict[int, int]] = [{}]  # [states] token -> state
        self.last = ROOT  # state of the whole text
        self.size = 0  # tokens in the text

    def __len__(self) -> int:
        return len(self.length)

    def _new_state(self, length: int, link: int, first_end: int, next_: dict[int, int]) -> int:
        self.length.append(length)
        self.link.append(link)
        self.first_end.append(first_end)
        self.next.append(next_)
        return len(self.length) - 1

    def extend(self, token: int) -> None:
        """Append ``token`` to the text (the classic construction: new state, then at most one clone)."""
        length, link, next_ = self.length, self.link, self.next
        end = self.size
        cur = self._new_state(length[self.last] + 1, -1, end, {})
        p = self.last
        while p != -1 and token not in next_[p]:
            next_[p][token] = cur
            p = link[p]
        if p == -1:
            link[cur] = ROOT
        else:
            q = next_[p][token]
            if length[p] + 1 == length[q]:
                link[cur] = q
            else:  # split q: its substrings up to length[p] + 1 now also end at `end`
                clone = self._new_state(length[p] + 1, link[q], self.first_end[q], dict(next_[q]))
                while p != -1 and next_[p].get(token) == q:
                    next_[p][token] = clone
                    p = link[p]
                link[q] = clone
                link[cur] = clone
        self.last = cur
        self.size += 1

    def transition(self, state: int, token: int) -> int:
        return self.next[state].get(token, -1)

    def link_of(self, state: int) -> int:
        return self.link[state]

    def length_of(self, state: int) -> int:
        return self.length[state]

    def first_end_of(self, state: int) -> int:
        return self.first_end[state]

    def to_static(self) -> StaticAutomaton:
        """The same automaton as flat arrays (transitions sorted by token within each state)."""
        n_states = len(self.length)
        counts = np.fromiter((len(d) for d in self.next), dtype=np.int64, count=n_states)
        offsets = np.zeros(n_states + 1, np.int32)  # edges < 3 * tokens < 2**31 (datastore's limit)
        offsets[1:] = np.cumsum(counts)
        n_edges = int(offsets[-1])
        edge_tokens = np.fromiter(chain.from_iterable(self.next), dtype=np.int32, count=n_edges)
        edge_next = np.fromiter(chain.from_iterable(d.values() for d in self.next), dtype=np.int32, count=n_edges)
        # sort by (state, token): the state of edge e is the one whose offsets range holds e
        edge_state = np.repeat(np.arange(n_states, dtype=np.int64), counts)
        order = np.lexsort((edge_tokens, edge_state))
        return StaticAutomaton(
            length=np.asarray(self.length, np.int32),
            link=np.asarray(self.link, np.int32),
            first_end=np.asarray(self.first_end, np.int32),
            offsets=offsets,
            edge_tokens=edge_tokens[order],
            edge_next=edge_next[order],
        )


def build(tokens: np.ndarray | list[int]) -> SuffixAutomaton:
    """The suffix automaton of ``tokens`` ([n] ints >= 0)."""
    sam = SuffixAutomaton()
    for token in np.asarray(tokens).tolist():
        sam.extend(token)
    return sam


@dataclass(frozen=True, eq=False)
class StaticAutomaton:
    """A suffix automaton as arrays; state 0 is the root."""

    length: np.ndarray  # [states] int32
    link: np.ndarray  # [states] int32, -1 at the root
    first_end: np.ndarray  # [states] int32, -1 at the root
    offsets: np.ndarray  # [states + 1] int32: the transitions of v are edges offsets[v]:offsets[v + 1]
    edge_tokens: np.ndarray  # [edges] int32, ascending within each state
    edge_next: np.ndarray  # [edges] int32, target state of each edge

    def __post_init__(self) -> None:
        n = len(self.length)
        if self.link.shape != (n,) or self.first_end.shape != (n,) or self.offsets.shape != (n + 1,):
            raise ValueError(
                f"StaticAutomaton: length {self.length.shape}, link {self.link.shape}, first_end "
                f"{self.first_end.shape} must be [states] and offsets {self.offsets.shape} [states + 1]"
            )
        if self.edge_tokens.shape != self.edge_next.shape or len(self.edge_tokens) != int(self.offsets[-1]):
            raise ValueError(
                f"StaticAutomaton: edge_tokens {self.edge_tokens.shape} and edge_next {self.edge_next.shape} "
                f"must both hold offsets[-1] = {int(self.offsets[-1])} edges"
            )

    def __len__(self) -> int:
        return len(self.length)

    def transition(self, state: int, token: int) -> int:
        lo, hi = int(self.offsets[state]), int(self.offsets[state + 1])
        i = lo + int(np.searchsorted(self.edge_tokens[lo:hi], token))
        if i < hi and self.edge_tokens[i] == token:
            return int(self.edge_next[i])
        return -1

    def link_of(self, state: int) -> int:
        return int(self.link[state])

    def length_of(self, state: int) -> int:
        return int(self.length[state])

    def first_end_of(self, state: int) -> int:
        return int(self.first_end[state])


def advance(sam: Automaton, state: int, matched: int, token: int) -> tuple[int, int]:
    """One matching step: (state, matched) of the longest suffix of ``stream + [token]`` that is a
    substring of the automaton's text, given that of ``stream``. Follows suffix links on a miss."""
    while True:
        target = sam.transition(state, token)
        if target >= 0:
            return target, matched + 1
        if state == ROOT:
            return ROOT, 0
        state = sam.link_of(state)
        matched = sam.length_of(state)


def match_states(sam: Automaton, state: int, matched: int, min_length: int, limit: int) -> list[tuple[int, int]]:
    """Up to ``limit`` (state, match length) pairs along the suffix links from the match, longest
    first, while the match is at least ``min_length`` tokens: shorter suffixes of the same context
    whose first occurrences may differ (more end positions to draft from)."""
    found: list[tuple[int, int]] = []
    while state != ROOT and matched >= max(min_length, 1) and len(found) < limit:
        found.append((state, matched))
        state = sam.link_of(state)
        matched = sam.length_of(state)
    return found
