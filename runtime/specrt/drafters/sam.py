"""``sam_decoding``, ``asam``, ``asam_verify``: speculative decoding with suffix automata
(Hu et al., 2024, "SAM Decoding").

Two suffix automata (specrt.drafters.indexes.suffix_automaton) each keep a match: the state of the longest suffix
of the context that they contain, extended by every new token in amortised O(1).

* static: built by the pipeline over the retrieval datastore, loaded memory-mapped;
* live: built online over the request's own text. It holds every token but the newest when the
  newest is matched, so its match is the longest suffix that occurred *earlier*, and the tokens
  that followed that occurrence are there to draft.

A state's continuation is the text after the first end position of its substrings (cut at the
end of the document). Chain mode drafts the continuation of the longer match (ties: the live
one). Tree mode merges, longest match first, the continuations of both automata and of up to
``max_branches - 1`` states along each one's suffix links (shorter matches, other end positions)
into one trie; the longest match is cut short enough to leave one node for each other branch.

``asam``: adaptive SAM decoding. The draft depth is capped by a high quantile of the accepted
length, estimated from the verifier's verdicts (:class:`AcceptanceModel`). ``asam_verify`` also
weighs the measured verify cost: it picks the depth L that maximises expected emitted tokens per
second, ``(1 + sum_{d <= L} P(accepted >= d)) / verify_cost(L + 1)``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from specrt.drafters.base import Drafter, DrafterEnv, Feedback, datastore_for
from specrt.drafters.indexes.datastore import Datastore
from specrt.drafters.indexes.suffix_automaton import ROOT, SuffixAutomaton, advance, match_states
from specrt.drafters.pld import build_trie
from specrt.tree import DraftTree


class SamDecoding:
    def __init__(self, datastore: Datastore | None, tree: bool = False, min_match: int = 2, max_branches: int = 4):
        if min_match < 1:
            raise ValueError(f"sam_decoding: min_match must be >= 1, got {min_match}")
        if max_branches < 1:
            raise ValueError(f"sam_decoding: max_branches must be >= 1, got {max_branches}")
        self.datastore = datastore  # None: the live automaton only
        self.tree = tree
        self.min_match = min_match
        self.max_branches = max_branches if tree else 1
        self._reset()

    def _reset(self) -> None:
        self.text: list[int] = []  # [t] the request's tokens seen so far
        self.live = SuffixAutomaton()  # over text[:-1] while text[-1] is matched, then over text
        self.live_match = (ROOT, 0)  # (state, length) in the live automaton
        self.static_match = (ROOT, 0)  # (state, length) in the datastore's automaton

    def _push(self, token: int) -> None:
        if self.datastore is not None:
            self.static_match = advance(self.datastore.automaton, *self.static_match, token)
        state, matched = advance(self.live, *self.live_match, token)
        self.live.extend(token)
        link, length = self.live.link, self.live.length
        while state != ROOT and matched <= length[link[state]]:  # the extension split the state
            state = link[state]
        self.live_match = (state, matched)
        self.text.append(token)

    def _sync(self, context: np.ndarray) -> None:
        """Feed the tokens of ``context`` not seen yet (a shorter context starts over)."""
        if len(context) < len(self.text):
            self._reset()
        for token in context[len(self.text) :].tolist():
            self._push(token)

    def candidates(self, depth: int) -> list[np.ndarray]:
        """Non-empty continuations of at most ``depth`` tokens, longest match first (ties: live)."""
        found: list[tuple[int, int, np.ndarray]] = []  # (match length, 0 live / 1 static, tokens)
        for state, matched in match_states(self.live, *self.live_match, self.min_match, self.max_branches):
            start = self.live.first_end[state] + 1
            found.append((matched, 0, np.array(self.text[start : start + depth], np.int64)))
        if self.datastore is not None:
            sam = self.datastore.automaton
            for state, matched in match_states(sam, *self.static_match, self.min_match, self.max_branches):
                cont = self.datastore.continuation(sam.first_end_of(state) + 1, depth)
                if len(cont):
                    found.append((matched, 1, cont))
        found.sort(key=lambda c: (-c[0], c[1]))  # stable: longer states before their links
        return [tokens for _, _, tokens in found]

    def draft(self, context: np.ndarray, budget: int, depth: int) -> DraftTree:
        """At most ``budget`` nodes, at most ``depth`` deep."""
        self._sync(context)
        if budget < 1 or depth < 1:
            return DraftTree.empty()
        found = self.candidates(min(depth, budget))
        if not found:
            return DraftTree.empty()
        if not self.tree:
            return DraftTree.chain(found[0])
        # the longest match leaves one node for the first token of each other branch
        found[0] = found[0][: max(1, budget - (len(found) - 1))]
        return build_trie(found, budget)

    def propose(self, context: np.ndarray, budget: int) -> DraftTree:
        return self.draft(context, budget, budget)

    def begin(self, prompt: np.ndarray, hidden_states: np.ndarray) -> None:
        self._reset()
        self._sync(prompt)

    def observe(self, emitted: np.ndarray, feedback: Feedback) -> None:
        pass  # the new tokens arrive with the next context


class AcceptanceModel:
    """How deep drafts get accepted: per depth d, the probability that a drafted token at depth d
    is accepted given that the tokens above it were (Kaplan-Meier: a step that drafted D tokens
    and had a accepted judged depths 1..min(a + 1, D); depths past D say nothing). Counts decay by
    ``decay`` per step, so the estimate follows the text; a Beta prior fills unseen depths."""

    def __init__(self, max_depth: int = 64, decay: float = 0.98, prior: tuple[float, float] = (2.0, 1.0)):
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"AcceptanceModel: decay must be in (0, 1], got {decay}")
        if max_depth < 1 or min(prior) <= 0:
            raise ValueError(f"AcceptanceModel: need max_depth >= 1 and a positive prior, got {max_depth}, {prior}")
        self.decay = decay
        self.prior = prior  # (accepted, rejected) pseudo-counts per depth
        self.judged = np.zeros(max_depth)  # [max_depth] decayed steps that judged depth d + 1
        self.accepted = np.zeros(max_depth)  # [max_depth] ... and accepted it

    def record(self, drafted_depth: int, accepted_length: int) -> None:
        if drafted_depth < 1:
            return  # nothing drafted: nothing learned
        self.judged *= self.decay
        self.accepted *= self.decay
        self.judged[: min(accepted_length + 1, drafted_depth, len(self.judged))] += 1
        self.accepted[: min(accepted_length, len(self.accepted))] += 1

    def survival(self) -> np.ndarray:
        """[max_depth] P(accepted length >= d) for d = 1..max_depth."""
        a, r = self.prior
        return np.cumprod((self.accepted + a) / (self.judged + a + r))

    def quantile_cap(self, min_survival: float) -> int:
        """The deepest d with P(accepted length >= d) >= ``min_survival`` (at least 1): the
        (1 - min_survival)-quantile of the accepted length."""
        return max(1, int(np.count_nonzero(self.survival() >= min_survival)))

    def best_depth(self, limit: int, verify_cost: Callable[[int], float]) -> int | None:
        """The depth L in 0..limit maximising (1 + sum_{d <= L} P(accepted >= d)) / verify_cost(L + 1);
        None when no verify pass has been measured yet."""
        limit = max(0, min(limit, len(self.judged)))
        costs = np.array([verify_cost(s) for s in range(1, limit + 2)])  # [limit + 1] window s = L + 1
        if not np.all(costs > 0):
            return None
        tokens = 1.0 + np.concatenate([[0.0], np.cumsum(self.survival()[:limit])])  # [limit + 1]
        return int(np.argmax(tokens / costs))


class AdaptiveSam(SamDecoding):
    """``asam`` (and ``asam_verify`` when given ``verify_cost``): SAM decoding with the draft depth
    sized from the acceptance model. With ``verify_cost`` the depth also caps the node count (the
    cost is that of the whole window).

    When no depth pays (``asam_verify``'s best depth is 0) it proposes nothing but keeps a one-token
    *shadow* draft, judged on the token the plain step emits (under greedy the target accepts a
    one-token draft iff it is that token; under sampling with the same probability): a drafter
    that drafts nothing would otherwise learn nothing, and its estimate would never recover."""

    def __init__(
        self,
        datastore: Datastore | None,
        acceptance: AcceptanceModel,
        tree: bool = False,
        min_survival: float = 0.1,
        verify_cost: Callable[[int], float] | None = None,
        min_match: int = 2,
        max_branches: int = 4,
    ):
        if not 0.0 < min_survival < 1.0:
            raise ValueError(f"asam: min_survival must be in (0, 1), got {min_survival}")
        super().__init__(datastore, tree=tree, min_match=min_match, max_branches=max_branches)
        self.acceptance = acceptance  # shared by the requests of one model
        self.min_survival = min_survival
        self.verify_cost = verify_cost
        self._shadow: int | None = None  # the one-token draft held back at the last step

    def depth(self, budget: int) -> int:
        cap = min(budget, self.acceptance.quantile_cap(self.min_survival))
        if self.verify_cost is not None:
            best = self.acceptance.best_depth(budget, self.verify_cost)
            if best is not None:
                return best
        return cap

    def propose(self, context: np.ndarray, budget: int) -> DraftTree:
        depth = self.depth(budget) if budget > 0 else 0
        self._shadow = None
        if depth == 0 and budget > 0:
            probe = self.draft(context, 1, 1)
            self._shadow = int(probe.token_ids[0]) if len(probe) else None
            return DraftTree.empty()
        nodes = min(budget, depth) if self.verify_cost is not None else budget
        return self.draft(context, nodes, depth)

    def observe(self, emitted: np.ndarray, feedback: Feedback) -> None:
        drafted = int(feedback.tree.depths().max()) if len(feedback.tree) else 0
        if drafted:
            self.acceptance.record(drafted, len(feedback.path))
        elif self._shadow is not None and len(emitted):
            self.acceptance.record(1, int(emitted[0] == self._shadow))  # judged at depth 1 only
        self._shadow = None


def _acceptance(env: DrafterEnv, method: str) -> AcceptanceModel:
    return env.state.setdefault(f"{method}/{'tree' if env.tree else 'chain'}", AcceptanceModel())


def make(env: DrafterEnv) -> Drafter:
    return SamDecoding(datastore_for(env, "sam_decoding"), tree=env.tree)


def make_asam(env: DrafterEnv) -> Drafter:
    return AdaptiveSam(datastore_for(env, "asam"), _acceptance(env, "asam"), tree=env.tree)


def make_asam_verify(env: DrafterEnv) -> Drafter:
    return AdaptiveSam(
        datastore_for(env, "asam_verify"), _acceptance(env, "asam_verify"), tree=env.tree, verify_cost=env.verify_cost
    )
