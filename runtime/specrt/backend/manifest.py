"""The artifact manifest: what an exported decoder folder holds, and the checks before it is trusted.

An artifact folder (``artifacts/<model>/<variant>/``) holds ``manifest.json``, the ONNX decoder
(with its external-data file), ``tokenizer.json``, when the model has one its Jinja chat
template (``chat_template.jinja``, rendered by :mod:`specrt.chat`), and for a vision-language model
its vision encoder (``vision.onnx``). The manifest records every file's size and
sha256; :func:`read_manifest` refuses a folder whose files do not match.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specrt.backend.stamp import FileState, Verified, read_stamp, write_stamp
from specrt.errors import ArtifactError
from specrt.files import FileEntry, read_json_object, sha256_file

MANIFEST_NAME = "manifest.json"
FORMAT = "specrt-decoder/1"


@dataclass(frozen=True)
class ModelDims:
    num_layers: int
    kv_heads: int
    head_dim: int
    hidden: int
    vocab: int
    max_context: int  # longest sequence (prompt + generation) the runtime may build


@dataclass(frozen=True)
class ChatTemplate:
    """A single-user-turn chat prompt, rendered at export time: ``prefix + prompt + suffix``."""

    prefix: str
    suffix: str


@dataclass(frozen=True)
class ChatTemplateFile:
    """The model's own Jinja chat template (the checkpoint's ``tokenizer_config.json``
    ``chat_template``), a file of the folder, and the special tokens it may read by name."""

    # e.g. "chat_template.jinja"; listed in ``files`` (size and sha256 checked). A JSON file
    # ("tokenizer_config.json" of a Hugging Face folder) holds the template as its "chat_template" string.
    file: str
    special_tokens: dict[str, str] = field(default_factory=dict)  # "bos_token" -> "<|endoftext|>", ...


@dataclass(frozen=True)
class VisionSpec:
    """A vision-language artifact's image side: the encoder graph, the decoder's image token, and
    how images become pixel values and prompt text (specrt.vision)."""

    # file name of the vision encoder graph: pixel_values [1, 3, side, side] -> image_embeds [1, seq, hidden]
    encoder: str
    image_token_id: int  # the placeholder whose rows are image embeddings (specrt.backend.contract)
    image_seq_len: int  # decoder rows per frame (seq)
    preprocess: dict[str, Any]  # specrt.vision.ImagePreprocess.to_dict(): resize, split, normalise
    prompt: dict[str, Any]  # specrt.vision.ImageTokens.to_dict(): the placeholder text of an image

    def encoder_files(self, files: dict[str, FileEntry]) -> list[str]:
        """The encoder graph and its external-data file, as ``files`` lists them."""
        return [name for name in (self.encoder, self.encoder + ".data") if name in files]


@dataclass(frozen=True)
class Manifest:
    name: str  # model name, e.g. "qwen2.5-coder-0.5b-instruct"
    variant: str  # "fp32", "int8", "int4", ...
    arch: str  # Hugging Face model_type: "qwen2", "llama", "gemma3"
    dims: ModelDims
    decoder: str  # file name of the ONNX graph inside the folder
    tokenizer: str  # file name of tokenizer.json inside the folder
    eos_token_ids: tuple[int, ...]
    files: dict[str, FileEntry]  # every file of the folder but the manifest
    io: dict[str, list[dict[str, Any]]]  # the contract table (see specrt.backend.contract)
    producers: dict[str, str]  # package -> version of the tools that built it
    chat: ChatTemplate | None = None  # one user turn, rendered at export (no Jinja needed)
    chat_template: ChatTemplateFile | None = None  # any messages (specrt.chat); None in older artifacts
    spec_safe: bool = True  # False: verify windows may disagree with single steps
    attention: str = "portable"  # "specrt": SpecAttention nodes (CPU, specrt's kernel library); see contract
    checks: dict[str, Any] = field(default_factory=dict)  # parity / lossless reports
    vision: VisionSpec | None = None  # a vision-language model's image side; None: text only
    format: str = FORMAT

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=False) + "\n"


def _require(raw: dict[str, Any], key: str, where: Path) -> Any:
    if key not in raw:
        raise ArtifactError(f"{where}: field {key!r} is missing")
    return raw[key]


def parse_manifest(raw: dict[str, Any], where: Path) -> Manifest:
    """Build a :class:`Manifest` from decoded JSON, naming the first missing or malformed field."""
    fmt = raw.get("format")
    if fmt != FORMAT:
        raise ArtifactError(
            f"{where}: field 'format' is {fmt!r}, expected {FORMAT!r}: this specrt reads only {FORMAT!r} "
            "artifacts; export the model again with this version's pipeline (or use the specrt that wrote it)"
        )
    try:
        dims = ModelDims(**_require(raw, "dims", where))
        files = {name: FileEntry(**entry) for name, entry in _require(raw, "files", where).items()}
        chat_raw = raw.get("chat")
        template_raw = raw.get("chat_template")
        return Manifest(
            name=str(_require(raw, "name", where)),
            variant=str(_require(raw, "variant", where)),
            arch=str(_require(raw, "arch", where)),
            dims=dims,
            decoder=str(_require(raw, "decoder", where)),
            tokenizer=str(_require(raw, "tokenizer", where)),
            eos_token_ids=tuple(int(t) for t in _require(raw, "eos_token_ids", where)),
            files=files,
            io=dict(_require(raw, "io", where)),
            producers=dict(raw.get("producers", {})),
            chat=ChatTemplate(**chat_raw) if chat_raw else None,
            chat_template=_template_file(template_raw, where) if template_raw else None,
            spec_safe=bool(raw.get("spec_safe", True)),
            attention=str(raw.get("attention", "portable")),
            checks=dict(raw.get("checks", {})),
            vision=_vision(raw["vision"], where) if raw.get("vision") is not None else None,
        )
    except TypeError as e:  # a nested record with unexpected or missing keys
        raise ArtifactError(f"{where}: malformed field ({e})") from None


def _vision(raw: Any, where: Path) -> VisionSpec:
    spec = VisionSpec(**raw) if isinstance(raw, dict) else None
    if spec is None or not isinstance(spec.encoder, str) or not isinstance(spec.image_token_id, int) \
            or not isinstance(spec.image_seq_len, int) or not isinstance(spec.preprocess, dict) \
            or not isinstance(spec.prompt, dict):
        raise ArtifactError(f"{where}: field 'vision' must be {{\"encoder\": str, \"image_token_id\": int, "
                            f"\"image_seq_len\": int, \"preprocess\": {{...}}, \"prompt\": {{...}}}}, got {raw!r}")
    return spec


def _template_file(raw: Any, where: Path) -> ChatTemplateFile:
    template = ChatTemplateFile(**raw) if isinstance(raw, dict) else None
    if template is None or not isinstance(template.file, str) or not isinstance(template.special_tokens, dict) \
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in template.special_tokens.items()):
        raise ArtifactError(f"{where}: field 'chat_template' must be {{\"file\": str, \"special_tokens\": "
                            f"{{str: str}}}}, got {raw!r}")
    return template


def verify_files(manifest: Manifest, folder: Path, *, check_hashes: bool = True) -> None:
    """Raise :class:`ArtifactError` naming the first file that is missing or differs from the manifest.

    Sizes are always checked; sha256s unless ``check_hashes=False``, and then only for files
    changed since the last load verified them (:mod:`specrt.backend.stamp`)."""
    named = [manifest.decoder, manifest.tokenizer]
    if manifest.chat_template is not None:
        named.append(manifest.chat_template.file)
    if manifest.vision is not None:
        named.append(manifest.vision.encoder)
    for name in named:
        if name not in manifest.files:
            raise ArtifactError(f"{folder / MANIFEST_NAME}: 'files' has no entry for {name!r}")
    stamp = read_stamp(folder) if check_hashes else {}
    verified: dict[str, Verified] = {}
    for name, entry in manifest.files.items():
        path = folder / name
        if not path.is_file():
            raise ArtifactError(f"{path}: file listed in the manifest is missing")
        size = path.stat().st_size
        if size != entry.bytes:
            raise ArtifactError(f"{path}: {size} bytes, manifest says {entry.bytes} (truncated or replaced?)")
        if not check_hashes:
            continue
        before = FileState.of(path)
        if stamp.get(name) == Verified(entry.sha256, before):
            verified[name] = stamp[name]
            continue
        if (found := sha256_file(path)) != entry.sha256:
            raise ArtifactError(
                f"{path}: sha256 differs from the manifest (corrupt or replaced): expected {entry.sha256}, "
                f"found {found}"
            )
        if FileState.of(path) == before:  # not written while it was hashed
            verified[name] = Verified(entry.sha256, before)
    if check_hashes and verified != stamp:
        write_stamp(folder, verified)


def read_manifest(folder: str | Path, *, check_hashes: bool = True) -> Manifest:
    """Read and verify ``folder/manifest.json`` and the files it lists."""
    folder = Path(folder)
    path = folder / MANIFEST_NAME
    if not folder.is_dir():
        raise ArtifactError(f"{folder}: artifact folder does not exist")
    if not path.is_file():
        raise ArtifactError(f"{path}: no manifest (is this an artifact folder built by the pipeline?)")
    manifest = parse_manifest(read_json_object(path), path)
    verify_files(manifest, folder, check_hashes=check_hashes)
    return manifest
