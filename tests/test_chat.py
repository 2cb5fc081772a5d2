"""Chat messages through the model's own Jinja chat template (specrt.chat), torch-free: literal
prompts of Qwen2.5's template (the default model's), the same text as transformers'
apply_chat_template, the export storing the template, the model API and the CLI, and the errors."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import specrt
from specrt.backend.manifest import ChatTemplateFile
from specrt.chat import ChatRenderer, Message, messages
from specrt.errors import ArtifactError, InvalidRequestError, MissingDependencyError
from tests.helpers import EOS, QWEN25_CHAT_TEMPLATE, with_chat

QWEN = QWEN25_CHAT_TEMPLATE.read_text()
QWEN_TOKENS = {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
DEFAULT_SYSTEM = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"

CONVERSATIONS = [  # (messages, the literal prompt Qwen2.5's template renders with the generation prompt)
    ([{"role": "user", "content": "hi"}],
     DEFAULT_SYSTEM + "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
     "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
      {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3?"}],
     "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
     "<|im_start|>user\nand 3+3?<|im_end|>\n<|im_start|>assistant\n"),
    ([{"role": "user", "content": [{"type": "text", "text": "héllo "}, {"type": "text", "text": "wörld"}]}],
     DEFAULT_SYSTEM + "<|im_start|>user\nhéllo wörld<|im_end|>\n<|im_start|>assistant\n"),
]


@pytest.mark.parametrize("msgs, want", CONVERSATIONS)
def test_qwen25_template_renders_literal_prompts(msgs, want):
    assert ChatRenderer(QWEN, QWEN_TOKENS).render(messages(msgs)) == want


def test_without_the_generation_prompt():
    msgs = messages([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
    got = ChatRenderer(QWEN, QWEN_TOKENS).render(msgs, add_generation_prompt=False)
    assert got == DEFAULT_SYSTEM + "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n"


@pytest.mark.parametrize("msgs, _", CONVERSATIONS)
def test_renders_as_transformers_apply_chat_template(tmp_path, msgs, _):
    pytest.importorskip("transformers")
    from transformers import PreTrainedTokenizerFast

    from tests.helpers import tiny_tokenizer

    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(tiny_tokenizer(tmp_path / "t.json")), eos_token=EOS,
                                        bos_token="<bos-text>")
    template = "{{ bos_token }}" + QWEN + "{{ eos_token | tojson }}"  # the special tokens and tojson too
    tokenizer.chat_template = template
    plain = [{"role": m.role, "content": m.content} for m in messages(msgs)]  # text parts joined, as we do
    want = tokenizer.apply_chat_template(plain, tokenize=False, add_generation_prompt=True)
    got = ChatRenderer(template, tokenizer.special_tokens_map).render(messages(msgs))
    assert got == want and got.startswith("<bos-text><|im_start|>system") and got.endswith('"<eos>"')


def test_template_errors_are_request_errors():
    alternate = ("{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
                 "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
                 "{% endif %}{{ m.content }}{% endfor %}")
    renderer = ChatRenderer(alternate, {}, name="tpl")
    assert renderer.render(messages([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])) == "ab"
    with pytest.raises(InvalidRequestError, match=r"^tpl refused the messages: Conversation roles must alternate"):
        renderer.render(messages([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]))
    with pytest.raises(InvalidRequestError, match=r"^tpl: not a valid Jinja template \(line 1: "):
        ChatRenderer("{% for m in messages %}", {}, name="tpl")


def test_the_sandbox_refuses_python_internals():
    renderer = ChatRenderer("{{ messages.__class__.__mro__ }}", {}, name="tpl")
    with pytest.raises(InvalidRequestError, match=r"^tpl refused the messages: access to attribute '__class__'"):
        renderer.render(messages([{"role": "user", "content": "a"}]))


@pytest.mark.parametrize("raw, message", [
    ([], r"^messages must be a non-empty list"),
    ("hi", r"^messages must be a non-empty list"),
    ([{"role": "user", "content": "a"}, "b"], r"^messages\[1\] must be an object with role and content, got str$"),
    ([{"role": "robot", "content": "a"}], r"^messages\[0\]\.role must be one of system, user, assistant, tool, "
                                          r"got 'robot'$"),
    ([{"role": "user"}], r"^messages\[0\]\.content must be a string or a list of text parts, got NoneType$"),
    ([{"role": "user", "content": [{"type": "image_url"}]}], r"^messages\[0\]\.content parts must be"),
])
def test_bad_messages_name_the_field(raw, message):
    with pytest.raises(InvalidRequestError, match=message):
        messages(raw)


def test_messages_accepts_message_records():
    assert messages([Message("user", "a")]) == (Message("user", "a"),)


def test_missing_jinja2_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "jinja2", None)  # import jinja2 raises ImportError
    with pytest.raises(MissingDependencyError, match=r"needs jinja2: pip install 'specrt\[chat\]'"):
        ChatRenderer(QWEN, {})


def test_the_core_runtime_does_not_import_jinja2(tiny_chat_artifact):
    code = (f"import sys, specrt; m = specrt.load({str(tiny_chat_artifact)!r}); m.encode('hi', chat=True); "
            "assert 'jinja2' not in sys.modules; m.encode_chat([{'role': 'user', 'content': 'hi'}]); "
            "assert 'jinja2' in sys.modules")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


# --- the artifact and the model ---------------------------------------------------------------

def test_export_stores_the_template(tiny_chat_artifact):
    model = specrt.load(tiny_chat_artifact)
    assert model.manifest.chat_template == ChatTemplateFile("chat_template.jinja", {"eos_token": EOS})
    assert (tiny_chat_artifact / "chat_template.jinja").read_text() == QWEN
    assert "chat_template.jinja" in model.manifest.files
    assert model.manifest.chat.prefix == DEFAULT_SYSTEM + "<|im_start|>user\n"  # the single-turn form stays


def test_quantized_variants_keep_the_template(tiny_chat_artifact, tmp_path):
    from pipeline.lib.quantize_graph import QuantConfig
    from pipeline.quantize import quantize_artifact

    config = QuantConfig(method="specrt_q4", bits=4, block_size=32, lm_head_bits=4, embedding_bits=4)
    prompts = [specrt.load(tiny_chat_artifact).encode("def add(a, b):")]
    quantize_artifact(tiny_chat_artifact, tmp_path / "int4", "int4", config, prompts,
                      {"new_tokens": 4, "widths": [4], "prefill_chunk": 16}, bench_steps=1)
    int4 = specrt.load(tmp_path / "int4")
    assert int4.manifest.chat_template == ChatTemplateFile("chat_template.jinja", {"eos_token": EOS})
    assert int4.chat_prompt(CONVERSATIONS[1][0]) == CONVERSATIONS[1][1]


def test_a_changed_template_file_is_refused(tiny_chat_artifact, tmp_path):
    folder = tmp_path / "fp32"
    with_chat(tiny_chat_artifact, folder, QWEN)
    (folder / "chat_template.jinja").write_text(QWEN.replace("Qwen", "Qwex"))  # same size, other bytes
    with pytest.raises(ArtifactError, match=r"chat_template.jinja: sha256 differs from the manifest"):
        specrt.load(folder)


def test_encode_chat_is_the_rendered_text_without_added_special_tokens(tiny_chat_artifact):
    model = specrt.load(tiny_chat_artifact)
    for msgs, want in CONVERSATIONS:
        ids = model.encode_chat(msgs)
        assert ids.dtype == np.int64
        assert ids.tolist() == model.tokenizer.encode(want, add_special_tokens=False).ids
        assert model.chat_prompt(msgs) == want
    # one user turn: the same ids as the prefix and suffix rendered at export
    assert model.encode_chat([{"role": "user", "content": "hi"}]).tolist() == model.encode("hi", chat=True).tolist()


def test_chat_equals_plain_decoding_of_the_rendered_prompt(tiny_chat_artifact):
    model = specrt.load(tiny_chat_artifact)
    msgs = CONVERSATIONS[2][0]
    want, _ = model.generate_ids(model.tokenizer.encode(CONVERSATIONS[2][1], add_special_tokens=False).ids,
                                 method="baseline", max_new_tokens=12)
    got = model.chat(msgs, method="pld", max_new_tokens=12)
    assert list(got.token_ids) == want.tolist()
    assert got.prompt_token_ids == tuple(model.encode_chat(msgs).tolist())
    assert "".join(model.stream_chat(msgs, method="pld", max_new_tokens=12)) == got.text


def test_an_artifact_without_a_stored_template(tiny_chat_artifact, tmp_path):
    # exported before templates were stored: one user turn through the export's prefix and suffix
    old = specrt.load(with_chat(tiny_chat_artifact, tmp_path / "old", None))
    assert old.manifest.chat_template is None
    assert old.encode_chat([{"role": "user", "content": "hi"}]).tolist() == old.encode("hi", chat=True).tolist()
    with pytest.raises(InvalidRequestError, match=r"^tiny-qwen2/fp32 keeps only a single-user-turn chat prompt "
                                                   r"\(exported before chat templates were stored"):
        old.chat(CONVERSATIONS[1][0])
    # a model without any chat template
    bare = tmp_path / "bare"
    with_chat(tiny_chat_artifact, bare, None)
    manifest = json.loads((bare / "manifest.json").read_text())
    manifest["chat"] = None
    (bare / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InvalidRequestError, match=r"^tiny-qwen2/fp32 has no chat template$"):
        specrt.load(bare).encode_chat([{"role": "user", "content": "hi"}])


def test_lone_surrogates_in_a_message_are_refused(tiny_chat_artifact):
    with pytest.raises(InvalidRequestError, match=r"^messages\[1\]\.content is not valid Unicode"):
        specrt.load(tiny_chat_artifact).chat([{"role": "system", "content": "a"},
                                              {"role": "user", "content": "\udcff"}])


def test_malformed_chat_template_field_is_an_artifact_error(tiny_chat_artifact, tmp_path):
    folder = with_chat(tiny_chat_artifact, tmp_path / "bad", QWEN)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["chat_template"] = {"file": "chat_template.jinja", "special_tokens": {"eos_token": 1}}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=r"field 'chat_template' must be"):
        specrt.load(folder)


# --- the CLI ----------------------------------------------------------------------------------

def test_cli_system_prompt_and_messages_file(tiny_chat_artifact, tmp_path):
    model = specrt.load(tiny_chat_artifact)
    history = CONVERSATIONS[2][0][1:3]  # user 2+2?, assistant 4
    path = tmp_path / "messages.json"
    path.write_text(json.dumps(history))
    want = model.chat([{"role": "system", "content": "Be brief."}, *history,
                       {"role": "user", "content": "and 3+3?"}], method="baseline", max_new_tokens=8)
    out = subprocess.run(
        [sys.executable, "-m", "specrt.cli", "generate", "--model", str(tiny_chat_artifact), "--method", "baseline",
         "--max-new-tokens", "8", "--system", "Be brief.", "--messages", str(path), "--json", "and 3+3?"],
        capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["token_ids"] == list(want.token_ids) and got["prompt_token_ids"] == list(want.prompt_token_ids)


def test_cli_messages_file_errors(tiny_chat_artifact, tmp_path):
    path = tmp_path / "messages.json"
    path.write_text('{"role": "user"}')
    out = subprocess.run([sys.executable, "-m", "specrt.cli", "generate", "--model", str(tiny_chat_artifact),
                          "--messages", str(path)], capture_output=True, text=True)
    assert out.returncode == 2
    want = f"specrt: error: {path}: messages must be a non-empty list of {{\"role\", \"content\"}} messages"
    assert out.stderr.strip() == want
    out = subprocess.run([sys.executable, "-m", "specrt.cli", "generate", "--model", str(tiny_chat_artifact)],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "a prompt, or --messages" in out.stderr
