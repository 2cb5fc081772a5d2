"""The prefix cache: which rows a prompt reuses, what it evicts, and that a hit changes nothing.

A hit must leave the KV cache, the first token's logits and the hidden states bit for bit as a
cold prefill of the same prompt with the same chunk leaves them, on the host and on the device
cache, and every method's output token for token the same.
"""

from __future__ import annotations

import numpy as np
import pytest

import specrt
from specrt import InvalidRequestError
from specrt.backend.prefill import prefill
from specrt.backend.session import OrtDecoder
from specrt.engine.prefix_cache import PrefixCache, PrefixEntry
from specrt.sequences import common_prefix

CHUNK = 4


def entry(tokens: list[int], chunk: int = CHUNK, fill: float = 0.0) -> PrefixEntry:
    """An entry of 2 buffers, 1 head, 2 dims, hidden 3, vocab 5; ``fill`` marks its arrays."""
    t = len(tokens)
    return PrefixEntry(
        tokens=np.array(tokens, np.int64),
        kv=np.full((2, t, 1, 2), fill, np.float32),
        hidden=np.full((t, 3), fill, np.float32),
        last_logits=np.full(5, fill, np.float32),
        chunk=chunk,
    )


def test_common_prefix():
    assert common_prefix(np.array([1, 2, 3]), np.array([1, 2, 4, 5])) == 2
    assert common_prefix(np.array([1, 2]), np.array([1, 2, 3])) == 2
    assert common_prefix(np.array([7]), np.array([1])) == 0
    assert common_prefix(np.zeros(0, np.int64), np.array([1])) == 0


def test_the_same_prompt_is_a_whole_hit():
    cache = PrefixCache(1 << 20)
    cache.insert(entry([1, 2, 3, 4, 5, 6]))
    hit = cache.lookup(np.array([1, 2, 3, 4, 5, 6]), CHUNK)
    assert hit is not None and hit.whole and hit.rows == 6


def test_a_shared_prefix_reuses_whole_chunks_only():
    cache = PrefixCache(1 << 20)
    cache.insert(entry(list(range(11))))  # passes [0, 4) [4, 8) [8, 11)
    cases = [  # prompt -> rows reused
        (list(range(10)) + [99], 8),  # shares 10 tokens: two whole passes
        (list(range(7)) + [99, 98], 4),  # shares 7: one pass
        ([0, 1, 2, 99, 98, 97], None),  # shares 3: less than a pass
        (list(range(8)), 4),  # a prefix of the entry, 8 long: keep one pass to run for the first token
        (list(range(9)), 8),
        (list(range(12)), 8),  # extends the entry by one token
    ]
    for prompt, rows in cases:
        hit = cache.lookup(np.array(prompt), CHUNK)
        assert (None if hit is None else hit.rows) == rows, prompt
        assert hit is None or not hit.whole


def test_another_chunk_size_never_hits():
    cache = PrefixCache(1 << 20)
    cache.insert(entry(list(range(11)), chunk=4))
    assert cache.lookup(np.arange(11), 5) is None
    assert cache.lookup(np.arange(11), 4) is not None
    assert (cache.hits, cache.misses) == (1, 1)


def test_the_entry_that_saves_most_rows_wins():
    cache = PrefixCache(1 << 20)
    cache.insert(entry(list(range(6)), fill=1.0))
    cache.insert(entry(list(range(10)) + [50], fill=2.0))
    cache.insert(entry(list(range(5)) + [60] * 6, fill=3.0))
    hit = cache.lookup(np.array(list(range(10)) + [70, 71]), CHUNK)
    assert hit is not None and hit.rows == 8 and hit.entry.kv[0, 0, 0, 0] == 2.0


def test_least_recently_used_entries_go_first():
    one = entry([1] * 5)
    cache = PrefixCache(3 * one.nbytes)
    for first in (1, 2, 3):
        cache.insert(entry([first] * 5))
    assert cache.lookup(np.array([1] * 5), CHUNK) is not None  # 1 is now the most recent
    cache.insert(entry([4] * 5))  # drops 2, the least recently used
    assert len(cache) == 3 and cache.nbytes == 3 * one.nbytes
    assert cache.lookup(np.array([2] * 5), CHUNK) is None
    for kept in (1, 3, 4):
        assert cache.lookup(np.array([kept] * 5), CHUNK) is not None


def test_an_entry_larger_than_the_cache_is_not_kept_and_evicts_nothing():
    small = entry([1] * 4)
    cache = PrefixCache(small.nbytes + 8)
    assert cache.insert(small)
    assert not cache.insert(entry([2] * 40))
    assert len(cache) == 1 and cache.lookup(np.array([1] * 4), CHUNK) is not None


def test_the_same_prompt_replaces_its_entry():
    cache = PrefixCache(1 << 20)
    cache.insert(entry([1, 2, 3, 4, 5], fill=1.0))
    cache.insert(entry([1, 2, 3, 4, 5], fill=2.0))
    assert len(cache) == 1 and cache.nbytes == entry([1, 2, 3, 4, 5]).nbytes
    hit = cache.lookup(np.array([1, 2, 3, 4, 5]), CHUNK)
    assert hit is not None and hit.entry.hidden[0, 0] == 2.0
    cache.clear()
    assert len(cache) == 0 and cache.nbytes == 0


def test_entries_are_read_only_and_consistent():
    e = entry([1, 2, 3])
    with pytest.raises(ValueError):
        e.kv[0, 0, 0, 0] = 1.0
    with pytest.raises(ValueError, match="3 tokens but kv rows 2"):
        PrefixEntry(np.array([1, 2, 3]), np.zeros((2, 2, 1, 2), np.float32), np.zeros((3, 3), np.float32),
                    np.zeros(5, np.float32), CHUNK)


@pytest.mark.parametrize("size", [-1, "64", True, float("nan")])
def test_prefix_cache_mb_is_checked(runtime_artifact, size):
    with pytest.raises(InvalidRequestError, match="prefix_cache_mb"):
        specrt.load(runtime_artifact, prefix_cache_mb=size)


def test_prefix_cache_size_in_bytes_is_checked():
    with pytest.raises(InvalidRequestError, match="prefix cache size must be an int >= 0 bytes"):
        PrefixCache(-5)


# ---------------------------------------------------------------------------------------------
# on a model: a hit leaves everything bit for bit as a cold prefill


def cold_prefill(folder, model, ids, chunk, **options):
    """(kv [2 layers.., t, heads, dim], hidden [t, hidden], last logits [vocab]) of a fresh decoder."""
    decoder = OrtDecoder(folder / model.manifest.decoder, model.manifest.dims, **options)
    decoder.reset(len(ids) + 1)
    outs = list(prefill(decoder, ids, chunk))
    return decoder.snapshot(len(ids)), np.concatenate([o.hidden_states for o in outs]), outs[-1].logits[-1]


@pytest.mark.parametrize("device_cache", [False, True], ids=["host", "device"])
def test_a_partial_hit_leaves_the_prefill_bit_exact(runtime_artifact, device_cache):
    folder = runtime_artifact
    model = specrt.load(folder, prefix_cache_mb=16, device_cache=device_cache)
    rng = np.random.default_rng(3)
    first = rng.integers(0, model.manifest.dims.vocab, 23)
    second = np.concatenate([first[:17], rng.integers(0, model.manifest.dims.vocab, 9)])  # shares 17: 3 passes of 5
    _, loop = model.generate_ids(first, method="baseline", max_new_tokens=3, prefill_chunk=5)
    assert loop.stats.cached_prompt_tokens == 0
    _, loop = model.generate_ids(second, method="baseline", max_new_tokens=3, prefill_chunk=5)
    assert loop.stats.cached_prompt_tokens == 15
    hit = model.prefix_cache.lookup(second, 5)
    assert hit is not None and hit.whole
    kv, hidden, logits = cold_prefill(folder, model, second, 5, device_cache=device_cache)
    assert np.array_equal(hit.entry.kv, kv)
    assert np.array_equal(hit.entry.hidden, hidden)
    assert np.array_equal(hit.entry.last_logits, logits)


@pytest.mark.parametrize("method, tree", [("baseline", False), ("pld", False), ("pld", True),
                                          ("suffix_decoding", True), ("token_recycling", False)])
def test_every_method_emits_the_same_tokens_from_a_hit(runtime_artifact, method, tree):
    from tests.helpers import PROMPTS

    folder = runtime_artifact
    cached = specrt.load(folder, prefix_cache_mb=16)
    cold = specrt.load(folder)
    for text in PROMPTS:
        ids = cold.encode(text)
        want, _ = cold.generate_ids(ids, method=method, tree=tree, max_new_tokens=24, prefill_chunk=4)
        for _ in range(2):  # the first run fills the cache, the second is a whole hit
            got, loop = cached.generate_ids(ids, method=method, tree=tree, max_new_tokens=24, prefill_chunk=4)
            assert np.array_equal(got, want), (text, method, tree)
        assert loop.stats.cached_prompt_tokens == len(ids)


def test_a_seeded_sample_repeats_from_a_hit(runtime_artifact):
    folder = runtime_artifact
    model = specrt.load(folder, prefix_cache_mb=16)
    ids = model.encode("The quick brown fox jumps over the lazy dog. The quick brown")
    runs = [model.generate_ids(ids, method="pld", temperature=1.0, seed=11, max_new_tokens=20)[0] for _ in range(2)]
    cold = specrt.load(folder).generate_ids(ids, method="pld", temperature=1.0, seed=11, max_new_tokens=20)[0]
    assert np.array_equal(runs[0], cold) and np.array_equal(runs[1], cold)


def test_no_cache_by_default(runtime_artifact):
    model = specrt.load(runtime_artifact)
    ids = model.encode("x y z")
    for _ in range(2):
        _, loop = model.generate_ids(ids, method="baseline", max_new_tokens=2)
        assert loop.stats.cached_prompt_tokens == 0
    assert model.prefix_cache is None


def test_concurrent_requests_share_the_cache_and_keep_their_outputs(runtime_artifact):
    from concurrent.futures import ThreadPoolExecutor

    from tests.helpers import PROMPTS

    folder = runtime_artifact
    cold = specrt.load(folder)
    cached = specrt.load(folder, prefix_cache_mb=16)
    shared = "for i in range(10):\n    print(i)\n" * 3  # a common beginning: whole chunks of 4 to reuse
    prompts = [cold.encode(shared + text) for text in PROMPTS] * 3  # each prompt three times
    options = dict(method="suffix_decoding", tree=True, max_new_tokens=16, prefill_chunk=4)
    want = [cold.generate_ids(ids, **options)[0] for ids in prompts]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda ids: cached.generate_ids(ids, **options), prompts))
    for (ids, _), expected in zip(got, want, strict=True):
        assert np.array_equal(ids, expected)
    assert sum(loop.stats.cached_prompt_tokens > 0 for _, loop in got) >= len(PROMPTS)  # the repeats hit at least
    assert cached.prefix_cache.hits >= len(PROMPTS)
