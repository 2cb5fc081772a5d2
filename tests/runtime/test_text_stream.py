"""TextStream: streamed text in linear time (tokenizers' DecodeStream, or the windowed fallback for
tokenizers < 0.21) whose pieces joined equal the decoded whole output, on byte-level tokens that
split characters, special tokens and invalid byte sequences."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

import specrt
import specrt.model
from specrt.model import TextStream
from tests.helpers import VOCAB, tiny_tokenizer


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")))


@pytest.fixture(params=["DecodeStream", "window"])
def impl(request, monkeypatch):
    if request.param == "DecodeStream":
        assert specrt.model.DecodeStream is not None  # the pinned tokenizers has it
    else:
        monkeypatch.setattr(specrt.model, "DecodeStream", None)
    return request.param


def test_characters_split_across_byte_tokens(tokenizer, impl):
    ids = tokenizer.encode("hé 🙂!").ids
    # h | Ã © (é) | Ġ (space) | ð Ł Ļ Ĥ (🙂, four byte tokens) | !
    assert [tokenizer.id_to_token(i) for i in ids] == ["h", "Ã", "©", "Ġ", "ð", "Ł", "Ļ", "Ĥ", "!"]
    text = TextStream(tokenizer)
    assert [text.push([i]) for i in ids] == ["h", "", "é", " ", "", "", "", "🙂", "!"]
    assert text.finish() == ""
    text = TextStream(tokenizer)
    assert [text.push(ids[:3]), text.push(ids[3:6]), text.push(ids[6:])] == ["hé", " ", "🙂!"]


def test_an_incomplete_character_at_the_end_is_flushed_as_decode_does(tokenizer, impl):
    ids = tokenizer.encode("hé 🙂").ids[:-1]  # the emoji's last byte missing
    text = TextStream(tokenizer)
    assert [text.push([i]) for i in ids] == ["h", "", "é", " ", "", "", ""]
    assert text.finish() == "\ufffd" and tokenizer.decode(ids) == "hé \ufffd"


def test_special_tokens_are_skipped(tokenizer, impl):
    eos = tokenizer.token_to_id("<eos>")
    ids = tokenizer.encode("ab").ids + [eos] + tokenizer.encode("é").ids
    text = TextStream(tokenizer)
    assert "".join(text.push([i]) for i in ids) + text.finish() == "abé"


@settings(max_examples=150, deadline=None)
@given(ids=st.lists(st.integers(0, VOCAB - 1), max_size=40), cuts=st.lists(st.integers(1, 5), max_size=40))
def test_pieces_joined_equal_the_whole_decode(tokenizer, ids, cuts):
    for window in (False, True):
        saved = specrt.model.DecodeStream
        specrt.model.DecodeStream = None if window else saved
        try:
            text, pieces, start = TextStream(tokenizer), [], 0
            for n in cuts + [len(ids)]:
                pieces.append(text.push(ids[start : start + n]))
                start += n
            pieces.append(text.finish())
        finally:
            specrt.model.DecodeStream = saved
        assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=True), (window, pieces)


def test_stream_equals_generate(runtime_chat_artifact):
    model = specrt.load(runtime_chat_artifact)
    for prompt in ("hé", "def add(a, b):", "The quick brown fox"):
        want = model.generate(prompt, method="pld", max_new_tokens=30)
        assert "".join(model.stream(prompt, method="pld", max_new_tokens=30)) == want.text
