"""Verified stamps (specrt.backend.stamp): an unchanged artifact folder is hashed once; a changed file, or
a manifest that expects another sha256, is hashed again and caught; the CLI can skip the hashes."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import specrt.backend.manifest
from specrt.backend.manifest import Manifest, ModelDims, read_manifest
from specrt.backend.stamp import stamp_path
from specrt.errors import ArtifactError
from specrt.files import FileEntry
from tests.helpers import with_chat


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SPECRT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def hashed(monkeypatch) -> list[str]:
    """The names of the files sha256_file hashes, in order."""
    names: list[str] = []
    real = specrt.files.sha256_file

    def counting(path: Path) -> str:
        names.append(path.name)
        return real(path)

    monkeypatch.setattr(specrt.backend.manifest, "sha256_file", counting)
    return names


def artifact(folder: Path) -> Path:
    """A folder whose manifest lists two files (their contents are not read at this level)."""
    folder.mkdir()
    (folder / "decoder.onnx").write_bytes(b"graph" * 100)
    (folder / "tokenizer.json").write_text('{"tokens": 1}')
    write_manifest(folder)
    return folder


def write_manifest(folder: Path, **sha_override: str) -> None:
    files = {}
    for p in ("decoder.onnx", "tokenizer.json"):  # not file_entry: the tests count what sha256_file hashes
        data = (folder / p).read_bytes()
        files[p] = FileEntry(sha_override.get(p.replace(".", "_"), hashlib.sha256(data).hexdigest()), len(data))
    manifest = Manifest(name="m", variant="fp32", arch="qwen2", dims=ModelDims(1, 1, 1, 1, 1, 8),
                        decoder="decoder.onnx", tokenizer="tokenizer.json", eos_token_ids=(0,), files=files, io={},
                        producers={})
    (folder / "manifest.json").write_text(manifest.to_json())


def test_a_second_load_skips_the_hashing(tmp_path, cache, hashed):
    folder = artifact(tmp_path / "a")
    read_manifest(folder)
    assert sorted(hashed) == ["decoder.onnx", "tokenizer.json"]
    read_manifest(folder)
    read_manifest(folder)
    assert len(hashed) == 2  # nothing hashed again
    assert stamp_path(folder).parent == cache / "verified"
    stamp = json.loads(stamp_path(folder).read_text())
    assert stamp["folder"] == str(folder.resolve()) and sorted(stamp["files"]) == ["decoder.onnx", "tokenizer.json"]
    assert sorted(p.name for p in folder.iterdir()) == ["decoder.onnx", "manifest.json", "tokenizer.json"]


def test_a_file_changed_in_place_is_caught_even_with_its_mtime_restored(tmp_path, cache, hashed):
    folder = artifact(tmp_path / "a")
    read_manifest(folder)
    path = folder / "decoder.onnx"
    st = path.stat()
    path.write_bytes(b"grapH" * 100)  # same size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same mtime; the ctime moved on
    with pytest.raises(ArtifactError, match=r"decoder.onnx: sha256 differs from the manifest"):
        read_manifest(folder)
    assert hashed[2:] == ["decoder.onnx"]  # only the changed file was hashed again


def test_a_manifest_expecting_another_hash_hashes_again(tmp_path, cache, hashed):
    folder = artifact(tmp_path / "a")
    read_manifest(folder)
    write_manifest(folder, tokenizer_json="0" * 64)
    want = r"tokenizer.json: sha256 differs from the manifest \(corrupt or replaced\): expected 0{64}, found "
    with pytest.raises(ArtifactError, match=want):
        read_manifest(folder)


def test_a_replaced_file_is_caught(tmp_path, cache, hashed):
    folder = artifact(tmp_path / "a")
    read_manifest(folder)
    other = tmp_path / "other.onnx"
    other.write_bytes(b"grapH" * 100)
    other.replace(folder / "decoder.onnx")  # a new inode
    with pytest.raises(ArtifactError, match=r"decoder.onnx: sha256 differs"):
        read_manifest(folder)


def test_without_hash_checks_nothing_is_hashed_or_stamped(tmp_path, cache, hashed):
    folder = artifact(tmp_path / "a")
    read_manifest(folder, check_hashes=False)
    assert hashed == [] and not stamp_path(folder).exists()
    (folder / "tokenizer.json").write_text('{"tokens": 2}')  # same size, other bytes
    read_manifest(folder, check_hashes=False)  # sizes only
    with pytest.raises(ArtifactError, match=r"tokenizer.json: sha256 differs"):
        read_manifest(folder)


def test_an_unreadable_stamp_means_hashing(tmp_path, cache, hashed):
    folder = artifact(tmp_path / "a")
    read_manifest(folder)
    stamp_path(folder).write_text("{not json")
    read_manifest(folder)
    assert len(hashed) == 4


def test_cli_skip_hash_check(runtime_chat_artifact, tmp_path, cache):
    folder = with_chat(runtime_chat_artifact, tmp_path / "fp32", "x" * 40)
    (folder / "chat_template.jinja").write_text("y" * 40)  # same size, other bytes: only the hash tells
    env = {**os.environ, "SPECRT_CACHE_DIR": str(cache)}
    args = [sys.executable, "-m", "specrt.cli", "generate", "--model", str(folder), "--method", "baseline",
            "--max-new-tokens", "3", "hello"]
    out = subprocess.run(args, capture_output=True, text=True, env=env)
    assert out.returncode == 2 and "chat_template.jinja: sha256 differs from the manifest" in out.stderr
    out = subprocess.run(args + ["--skip-hash-check"], capture_output=True, text=True, env=env)
    assert (out.returncode, out.stdout) == (0, "ooo\n")
