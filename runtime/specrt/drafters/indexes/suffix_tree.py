"""A suffix tree over token sequences, bounded in depth, for suffix decoding (Oliaro et al., 2024).

As in Arctic Inference's ``SuffixTree``, every inserted sequence adds all of its suffixes, each
cut to ``max_depth`` tokens, to one trie. A node stands for the substring spelled by its path
from the root; its ``count`` is the number of occurrences of that substring over all inserted
sequences, so ``child.count / node.count`` estimates the probability of the next token. For
``[1, 2, 1, 3]`` and ``max_depth = 2`` (suffixes ``[1, 2]``, ``[2, 1]``, ``[1, 3]``, ``[3]``)::

              root (4)
            /    |    \\
         1 (2)  2 (1)  3 (1)
         /  \\    |
     2 (1) 3 (1) 1 (1)

Counts never grow along a path: a node's children's counts sum to at most its own (occurrences
at the end of a sequence or at ``max_depth`` have no child). Sequences grow token by token
(``extend``: O(max_depth) per token, through the nodes of the suffixes still open) and can be
removed again (``remove``: every count they added is taken back; nodes that reach 0 go).

``speculate`` is Arctic's: for every match length m (the last m context tokens occur in the
tree and continue), grow a draft of at most ``min(max_spec_tokens, m * max_spec_factor +
max_spec_offset)`` tokens from the match node -- the single most frequent path (chain), or
best-first by path probability (tree) -- keeping tokens whose path probability is at least
``min_token_prob``; the draft with the highest score (sum of path probabilities = expected
accepted tokens under the tree's counts) wins, the longer match on ties. Drafts are scored from
the longest match down and the search stops once no shorter match could score higher.

:class:`SuffixCache` holds Arctic's request lifecycle: a global tree over previous responses and
a local tree over the active request (prompt + response so far); see its docstring.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass

import numpy as np

from specrt.tree import DraftTree


class _Node:
    __slots__ = ("count", "children")

    def __init__(self) -> None:
        self.count = 0  # occurrences of the substring this node spells
        self.children: dict[int, _Node] = {}  # next token -> node


@dataclass(frozen=True, eq=False)
class Draft:
    """A speculated draft tree with the tree's own estimate of each node's acceptance."""

    token_ids: np.ndarray  # [n] int64
    parents: np.ndarray  # [n] int64, -1 = child of the root, parents[i] < i
    probs: np.ndarray  # [n] float64, path probability (product of count ratios), non-increasing in i
    match_len: int = 0  # context tokens matched before the draft (0 when empty)

    @property
    def score(self) -> float:
        """Expected accepted tokens if the counts were the truth: sum of path probabilities."""
        return float(self.probs.sum())

    def __len__(self) -> int:
        return len(self.token_ids)

    def head(self, n: int) -> Draft:
        """The first ``n`` nodes: a tree again, since parents come before children."""
        return Draft(self.token_ids[:n], self.parents[:n], self.probs[:n], self.match_len if n > 0 else 0)

    def tree(self) -> DraftTree:
        return DraftTree(self.token_ids, self.parents)

    @staticmethod
    def empty() -> Draft:
        return Draft(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64))


def _draft(token_ids: list[int], parents: list[int], probs: list[float], match_len: int) -> Draft:
    return Draft(np.array(token_ids, np.int64), np.array(parents, np.int64), np.array(probs, np.float64), match_len)


class SuffixTree:
    """Suffixes of a set of sequences (by ``seq_id``), each cut to ``max_depth`` tokens."""

    def __init__(self, max_depth: int):
        if max_depth < 1:
            raise ValueError(f"SuffixTree: max_depth must be >= 1, got {max_depth}")
        self.max_depth = max_depth
        self.root = _Node()  # root.count = tokens inserted (one suffix starts at each)
        self.num_nodes = 0  # nodes below the root
        self._seqs: dict[int, list[int]] = {}  # seq_id -> its tokens
        self._open: dict[int, list[_Node]] = {}  # seq_id -> nodes of its suffixes of length 1, 2, ... that can grow

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._seqs

    def sequence(self, seq_id: int) -> list[int]:
        return self._seqs[seq_id]

    def extend(self, seq_id: int, tokens: np.ndarray | list[int]) -> None:
        """Append ``tokens`` ([k] int) to sequence ``seq_id`` (a new one when unseen)."""
        seq = self._seqs.setdefault(seq_id, [])
        open_nodes = self._open.get(seq_id, [])  # open_nodes[k] spells the last k + 1 tokens
        keep = self.max_depth - 1  # a node at max_depth never grows
        for token in np.asarray(tokens, np.int64).reshape(-1).tolist():
            grown = []
            for node in (self.root, *open_nodes):
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = _Node()
                    self.num_nodes += 1
                child.count += 1
                grown.append(child)
            del grown[keep:]
            open_nodes = grown
            self.root.count += 1
            seq.append(token)
        self._open[seq_id] = open_nodes

    def remove(self, seq_id: int) -> None:
        """Take back every count sequence ``seq_id`` added; nodes left with count 0 are deleted."""
        seq = self._seqs.pop(seq_id)
        self._open.pop(seq_id)
        for start in range(len(seq)):
            node = self.root
            node.count -= 1
            for token in seq[start : start + self.max_depth]:
                child = node.children[token]
                child.count -= 1
                if child.count == 0:  # only this occurrence was left: its subtree is one chain
                    del node.children[token]
                    self.num_nodes -= 1
                    while child.children:
                        (child,) = child.children.values()
                        self.num_nodes -= 1
                    break
                node = child

    def count(self, tokens: np.ndarray | list[int]) -> int:
        """Occurrences of the substring ``tokens`` (0 if absent or longer than max_depth)."""
        node = self._find(list(np.asarray(tokens, np.int64).reshape(-1).tolist()))
        return 0 if node is None else node.count

    def _find(self, tokens: list[int]) -> _Node | None:
        node: _Node | None = self.root
        for token in tokens:
            node = node.children.get(token)
            if node is None:
                return None
        return node

    def match(self, context: np.ndarray) -> list[_Node]:
        """Nodes of the context's suffixes of length 1, 2, ... that occur and continue, up to the
        longest such suffix (both properties shrink with the length, so the list is a prefix)."""
        tokens = np.asarray(context, np.int64)[-self.max_depth :].tolist()
        nodes: list[_Node] = []
        for m in range(1, len(tokens) + 1):
            node = self._find(tokens[len(tokens) - m :])
            if node is None or not node.children:
                break
            nodes.append(node)
        return nodes

    def speculate(
        self,
        context: np.ndarray,
        max_spec_tokens: int,
        max_spec_factor: float = 1.0,
        max_spec_offset: float = 0.0,
        min_token_prob: float = 0.1,
        use_tree_spec: bool = False,
    ) -> Draft:
        """The best draft continuing ``context`` ([t] int); empty when nothing matches."""
        best: tuple[list[int], list[int], list[float]] = ([], [], [])
        best_score, best_m = 0.0, 0
        nodes = self.match(context)
        grow = _speculate_tree if use_tree_spec else _speculate_path
        for m in range(len(nodes), 0, -1):
            cap = min(max_spec_tokens, int(m * max_spec_factor + max_spec_offset + 1e-6))
            if cap <= best_score:  # a draft of `cap` tokens scores at most `cap`, and cap shrinks with m
                break
            node = nodes[m - 1]
            if cap * max(c.count for c in node.children.values()) <= best_score * node.count:
                continue  # path probabilities never exceed the first step's
            found = grow(node, cap, min_token_prob)
            score = sum(found[2])
            if score > best_score:
                best, best_score, best_m = found, score, m
        return _draft(*best, best_m)


def _speculate_path(node: _Node, max_tokens: int, min_token_prob: float) -> tuple[list[int], list[int], list[float]]:
    """The most frequent path below ``node`` (first-inserted child on ties): token ids, parents, probs."""
    token_ids: list[int] = []
    probs: list[float] = []
    prob = 1.0
    while len(token_ids) < max_tokens and node.children:
        token, child = max(node.children.items(), key=lambda item: item[1].count)
        prob *= child.count / node.count
        if prob < min_token_prob:
            break
        token_ids.append(token)
        probs.append(prob)
        node = child
    return token_ids, list(range(-1, len(token_ids) - 1)), probs


def _speculate_tree(node: _Node, max_tokens: int, min_token_prob: float) -> tuple[list[int], list[int], list[float]]:
    """Best-first expansion below ``node`` by path probability (push order on ties): ids, parents, probs."""
    token_ids: list[int] = []
    parents: list[int] = []
    probs: list[float] = []
    heap: list[tuple[float, int, int, _Node, int]] = []  # (-prob, push order, token, node, parent index)
    order = itertools.count()

    def push_children(parent: _Node, prob: float, index: int) -> None:
        for token, child in parent.children.items():
            p = prob * child.count / parent.count
            if p >= min_token_prob:
                heapq.heappush(heap, (-p, next(order), token, child, index))

    push_children(node, 1.0, -1)
    while heap and len(token_ids) < max_tokens:
        neg_prob, _, token, child, parent = heapq.heappop(heap)
        token_ids.append(token)
        parents.append(parent)
        probs.append(-neg_prob)
        push_children(child, -neg_prob, len(token_ids) - 1)
    return token_ids, parents, probs


class SuffixCache:
    """Arctic's ``SuffixDecodingCache`` for one model serving one request at a time.

    Lifecycle: ``start_request(prompt)`` builds the local tree over the prompt;
    ``add_active_response(tokens)`` appends generated tokens to it; ``stop_request()`` folds the
    response into the global tree of previous responses (prompts are not kept). A
    ``start_request`` while a request is still active stops that one first, so a caller without
    an end-of-request hook (the engine builds a fresh drafter per request) folds each response
    when the next request starts. ``speculate`` asks both trees and keeps the higher score (the
    local one on ties).

    Eviction: the global tree keeps at most ``max_cached_requests`` responses and
    ``max_cached_tokens`` tokens; the oldest responses are removed first (FIFO), and a response
    longer than ``max_cached_tokens`` keeps only its last ``max_cached_tokens`` tokens. Memory is
    O(max_depth) nodes per cached token at worst (text that never repeats).
    """

    def __init__(self, max_depth: int = 24, max_cached_requests: int = 1000, max_cached_tokens: int = 100_000):
        if max_depth < 1:
            raise ValueError(f"SuffixCache: max_depth must be >= 1, got {max_depth}")
        if max_cached_requests < 0:
            raise ValueError(f"SuffixCache: max_cached_requests must be >= 0, got {max_cached_requests}")
        if max_cached_tokens < 0:
            raise ValueError(f"SuffixCache: max_cached_tokens must be >= 0, got {max_cached_tokens}")
        self.max_depth = max_depth
        self.max_cached_requests = max_cached_requests
        self.max_cached_tokens = max_cached_tokens
        self.global_tree = SuffixTree(max_depth)
        self.local_tree: SuffixTree | None = None  # the active request's prompt + response, as seq 0
        self.request_id = 0  # id of the active (or last) request
        self._cached: deque[int] = deque()  # seq ids of the global tree, oldest first
        self._next_seq = 0
        self._prompt_len = 0

    @property
    def active(self) -> bool:
        return self.local_tree is not None

    @property
    def cached_requests(self) -> int:
        return len(self._cached)

    @property
    def cached_tokens(self) -> int:
        return self.global_tree.root.count

    @property
    def active_length(self) -> int:
        """Prompt + response tokens of the active request (0 when none)."""
        return len(self.local_tree.sequence(0)) if self.local_tree is not None else 0

    def active_tokens(self) -> list[int]:
        return self.local_tree.sequence(0) if self.local_tree is not None else []

    def start_request(self, prompt: np.ndarray) -> int:
        """Begin a request with ``prompt`` ([t] int); returns its id."""
        if self.active:
            self.stop_request()
        self.local_tree = SuffixTree(self.max_depth)
        self.local_tree.extend(0, prompt)
        self._prompt_len = len(prompt)
        self.request_id += 1
        return self.request_id

    def add_active_response(self, tokens: np.ndarray) -> None:
        """Generated tokens ([k] int) of the active request."""
        if self.local_tree is None:
            raise RuntimeError("SuffixCache.add_active_response: no active request (call start_request first)")
        self.local_tree.extend(0, tokens)

    def stop_request(self) -> None:
        """End the active request: its response joins the global tree, then eviction runs."""
        if self.local_tree is None:
            raise RuntimeError("SuffixCache.stop_request: no active request")
        response = self.local_tree.sequence(0)[self._prompt_len :]
        self.local_tree = None
        if self.max_cached_tokens == 0 or self.max_cached_requests == 0 or not response:
            return
        self.global_tree.extend(self._next_seq, response[-self.max_cached_tokens :])
        self._cached.append(self._next_seq)
        self._next_seq += 1
        while len(self._cached) > self.max_cached_requests or self.cached_tokens > self.max_cached_tokens:
            self.global_tree.remove(self._cached.popleft())

    def speculate(
        self,
        context: np.ndarray,
        max_spec_tokens: int,
        max_spec_factor: float = 1.0,
        max_spec_offset: float = 0.0,
        min_token_prob: float = 0.1,
        use_tree_spec: bool = False,
    ) -> Draft:
        """The better of the local and the global tree's drafts for ``context`` ([t] int)."""
        options = (max_spec_tokens, max_spec_factor, max_spec_offset, min_token_prob, use_tree_spec)
        found = self.global_tree.speculate(context, *options) if self._cached else Draft.empty()
        if self.local_tree is not None:
            local = self.local_tree.speculate(context, *options)
            if local.score >= found.score:
                return local
        return found
