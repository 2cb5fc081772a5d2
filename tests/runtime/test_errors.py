"""Bad input gets a clear error naming the field or file; never a traceback from onnxruntime."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

import specrt
from specrt import ArtifactError, InvalidRequestError
from specrt.cli import main as cli_main


@pytest.fixture(scope="module")
def folder(runtime_artifact):
    return runtime_artifact


@pytest.fixture(scope="module")
def model(folder):
    return specrt.load(folder)


@pytest.fixture
def copy(folder, tmp_path):
    dst = tmp_path / "artifact"
    shutil.copytree(folder, dst)
    return dst


def test_unknown_method_lists_valid_ones(model):
    with pytest.raises(InvalidRequestError, match=r"unknown method 'nope'; valid methods: adapld, anpd, asam, "):
        model.generate("x", method="nope")


def test_missing_folder_and_manifest(tmp_path):
    with pytest.raises(ArtifactError, match="does not exist"):
        specrt.load(tmp_path / "absent")
    with pytest.raises(ArtifactError, match=r"manifest\.json: no manifest"):
        specrt.load(tmp_path)


def test_missing_file_is_named(copy):
    (copy / "decoder.onnx.data").unlink()
    with pytest.raises(ArtifactError, match=r"decoder\.onnx\.data: file listed in the manifest is missing"):
        specrt.load(copy)


def test_corrupt_file_is_named_with_both_hashes(copy):
    expected = json.loads((copy / "manifest.json").read_text())["files"]["decoder.onnx.data"]["sha256"]
    data = bytearray((copy / "decoder.onnx.data").read_bytes())
    data[100] ^= 0xFF  # same size, different content
    (copy / "decoder.onnx.data").write_bytes(bytes(data))
    found = hashlib.sha256(bytes(data)).hexdigest()
    with pytest.raises(
        ArtifactError, match=rf"decoder\.onnx\.data: sha256 differs .*expected {expected}, found {found}"
    ):
        specrt.load(copy)


def test_truncated_file_is_named(copy):
    with open(copy / "tokenizer.json", "r+b") as f:
        f.truncate(10)
    with pytest.raises(ArtifactError, match=r"tokenizer\.json: 10 bytes, manifest says"):
        specrt.load(copy, check_hashes=False)


def test_bad_manifest_field_is_named(copy):
    raw = json.loads((copy / "manifest.json").read_text())
    del raw["dims"]
    (copy / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(ArtifactError, match="field 'dims' is missing"):
        specrt.load(copy)
    (copy / "manifest.json").write_text("{not json")
    with pytest.raises(ArtifactError, match="not valid JSON"):
        specrt.load(copy)


def test_prompt_longer_than_context(model):
    context = model.manifest.dims.max_context
    for n in (context, context + 5):
        with pytest.raises(InvalidRequestError, match=rf"prompt of {n} tokens does not fit the model's context of "):
            model.generate_ids([1] * n, max_new_tokens=1)


def test_max_new_tokens_zero_returns_empty_completion(model):
    result = model.generate("def add(", max_new_tokens=0, method="pld")
    assert result.text == "" and result.token_ids == () and result.finish_reason == "length"


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"max_new_tokens": -1}, "max_new_tokens"),
        ({"temperature": -0.5}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"draft_budget": -1}, "draft_budget"),
    ],
)
def test_bad_options_name_the_field(model, options, field):
    with pytest.raises(InvalidRequestError, match=field):
        model.generate("x", **options)


def test_bad_prompt_types_and_ids(model):
    with pytest.raises(InvalidRequestError, match="prompt must be a str"):
        model.generate(123)
    with pytest.raises(InvalidRequestError, match="prompt token ids must lie in"):
        model.generate_ids([model.manifest.dims.vocab + 5])
    with pytest.raises(InvalidRequestError, match="prompt is empty"):
        model.generate("")


def test_chat_without_template(model):
    with pytest.raises(InvalidRequestError, match="has no chat template"):
        model.generate("hi", chat=True)


def test_unknown_provider(folder):
    with pytest.raises(InvalidRequestError, match=r"provider 'tpu' is not supported; choose one of \['cpu', 'cuda'\]"):
        specrt.load(folder, provider="tpu")


def test_cli_reports_errors_without_traceback(folder, tmp_path, capsys):
    assert cli_main(["generate", "--model", str(tmp_path / "nowhere"), "x"]) == 2
    assert cli_main(["generate", "--model", str(folder), "--method", "nope", "x"]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "valid methods" in err and "Traceback" not in err


def test_cli_pld_and_baseline_print_the_same_completion(folder, capsys):
    outs = []
    for method in ("pld", "baseline"):
        assert cli_main(["generate", "--model", str(folder), "--method", method, "--max-new-tokens", "20",
                         "def add(a, b):\n    return a + b\n\ndef add("]) == 0
        captured = capsys.readouterr()
        outs.append(captured.out)
        assert "tok/s" in captured.err and "tokens/step" in captured.err and "accepted drafts" in captured.err
    assert outs[0] == outs[1] and outs[0].strip()


def test_cli_json(folder, capsys):
    assert cli_main(["generate", "--model", str(folder), "--json", "--max-new-tokens", "5", "x"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert len(result["token_ids"]) <= 5 and "decode_tokens_per_s" in result["stats"]
