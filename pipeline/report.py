"""Write the results tables (docs/results.md) from the DVC metrics files under an artifacts folder.

    python -m pipeline.report [--artifacts artifacts] [--out docs/results.md] [--params params.yaml]

Not a DVC stage: it only reads the stages' metrics JSON, the files `dvc metrics show` lists:

- ``<model>/benchmark-<variant>.json`` (stage benchmark): speedup over plain decoding per method,
  chain and tree, overall and per Spec-Bench task; tokens per verify step; token match; prefill;
  the memory roofline of plain decoding;
- ``<model>/peers-<variant>.json`` (stage peers): decode tok/s of specrt, onnxruntime-genai,
  llama.cpp (where the run had it) and transformers on the same prompt ids, and their ratios;
- ``<model>/<variant>.json`` (stage quantize), ``<model>/export.json``: size, fidelity to fp32,
  the spec-safety gate, decode ms per token, parity;
- ``<model>/lossless-<variant>.json`` (stage lossless): every method, chain and tree, equal to plain
  decoding token for token or not;
- ``<model>/weights.json``, ``<model>/corpora.json``, ``pair/bench-<variant>.json`` (stage
  pair_bench: overall and per task).

The full benchmark (``dvc repro pipeline/full/dvc.yaml``) writes the same benchmark and peers JSON
under ``<model>/full/``, and the pair's under ``pair/full/``; when those exist they head the page.
The files that ``--params`` says the pipeline writes but that are absent are named at the top, and
their tables left out.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from .lib.atomic import write_text_atomic
from .lib.specbench import TASKS

log = logging.getLogger(__name__)

COMMAND = "python -m pipeline.report"
FULL = "full"  # <model>/full/: the full benchmark's metrics (same JSON as the quick ones)


# -- formatting ------------------------------------------------------------------------------------

def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Markdown table lines."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def ratio(value: float | None, ci95: Any = None) -> str:
    """``1.13x``; with a 95% interval ``[lo, hi]`` ``1.13x (1.05-1.21)``, with a half-width ``1.13x ±0.04``."""
    if value is None:
        return "-"
    text = f"{value:.2f}x"
    if isinstance(ci95, (list, tuple)) and len(ci95) == 2:
        text += f" ({ci95[0]:.2f}-{ci95[1]:.2f})"
    elif isinstance(ci95, (int, float)):
        text += f" ±{ci95:.2f}"
    return text


def number(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def threads_text(threads: int | None) -> str:
    return "onnxruntime default" if threads is None else str(threads)


# -- reading ---------------------------------------------------------------------------------------

class Metrics:
    """The metrics files of one artifacts folder; remembers which were read, missing or unreadable."""

    def __init__(self, root: Path):
        self.root = root
        self.read: list[str] = []
        self.missing: list[str] = []
        self.unreadable: list[str] = []

    def name(self, rel: str) -> str:
        """How a file is named on the page: under the artifacts folder's own name, never its absolute path."""
        return f"{self.root.name}/{rel}"

    def load(self, rel: str, *, expected: bool = True) -> dict[str, Any] | None:
        path = self.root / rel
        if not path.is_file():
            if expected and self.name(rel) not in self.missing:
                self.missing.append(self.name(rel))
            return None
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            self.unreadable.append(f"`{self.name(rel)}` ({e})")
            return None
        if self.name(rel) not in self.read:
            self.read.append(self.name(rel))
        return data


def expected_files(params: dict[str, Any]) -> dict[str, list[str]]:
    """Per section, the metrics files (relative to the artifacts folder) that ``dvc repro`` writes
    with these params."""
    models = params.get("models", [])
    quantized = params.get("quantized", [])
    variants = params.get("variants", [])
    bench = params.get("benchmark", {}).get("variants", [])
    peers = params.get("peers", {}).get("variants", [])
    pair = params.get("pair") or {}
    target = [pair["target"]] if pair.get("target") else []
    return {
        "weights": [f"{m}/weights.json" for m in models + target],
        "export": [f"{m}/export.json" for m in models + target],
        "quantize": [f"{m}/{q}.json" for m in models for q in quantized]
        + [f"{m}/{q}.json" for m in target for q in pair.get("quantized", [])],
        "lossless": [f"{m}/lossless-{v}.json" for m in models for v in variants],
        "corpora": [f"{m}/corpora.json" for m in models],
        "benchmark": [f"{m}/benchmark-{v}.json" for m in models for v in bench],
        "peers": [f"{m}/peers-{v}.json" for m in models for v in peers],
        "pair": [f"pair/bench-{v}.json" for v in pair.get("variants", [])],
    }


def discovered_files(root: Path) -> dict[str, list[str]]:
    """The same sections from the files present (no params.yaml)."""
    def found(pattern: str, exclude: Sequence[str] = ()) -> list[str]:
        return sorted(str(p.relative_to(root)) for p in root.glob(pattern)
                      if p.is_file() and not any(p.name.startswith(x) for x in exclude))
    return {
        "weights": found("*/weights.json"),
        "export": found("*/export.json"),
        "quantize": [f for f in found("*/int*.json") + found("*/fp16.json") if not f.startswith("pair/")],
        "lossless": found("*/lossless-*.json"),
        "corpora": found("*/corpora.json"),
        "benchmark": found("*/benchmark-*.json"),
        "peers": found("*/peers-*.json"),
        "pair": found("pair/bench-*.json"),
    }


# -- sections --------------------------------------------------------------------------------------

def split_run(name: str) -> tuple[str, str, str]:
    """``suffix_decoding/tree/t0/no-backoff`` -> (row label, mode, temperature tag)."""
    parts = name.split("/")
    method, mode = parts[0], parts[1] if len(parts) > 1 else "chain"
    temperature = parts[2] if len(parts) > 2 else "t0"
    label = method
    if temperature != "t0":
        label += f" ({temperature.replace('t', 'temperature ', 1)})"
    if "no-backoff" in parts[3:]:
        label += " (back-off off)"
    return label, mode, temperature


def benchmark_section(m: Metrics, rel: str, report: dict[str, Any], level: str) -> list[str]:
    runs: dict[str, dict[str, Any]] = report["runs"]
    tasks = report.get("tasks", {})
    prompts = ", ".join(f"{t} {n}" for t, n in tasks.items())
    plain = next((r for n, r in runs.items() if n.startswith("baseline/")), None)
    lines = [f"{level} {report['variant']} (`{m.name(rel)}`)", ""]
    facts = [f"{report['prompts']} prompts ({prompts})" if prompts else f"{report['prompts']} prompts",
             f"{report['max_new_tokens']} new tokens", f"threads: {threads_text(report.get('threads'))}",
             f"spec-safe: {'yes' if report.get('spec_safe') else 'no'}",
             f"lossless: {'yes' if report.get('lossless') else 'NO'}"]
    if plain is not None:
        facts.append(f"plain decoding {plain['decode_tokens_per_s']:.1f} tok/s")
        facts.append(f"prefill {plain['prefill_s']:.2f} s (plain decoding's cold prefill, summed over the prompts)")
    if report.get("best"):
        facts.append(f"best run: `{report['best']}`")
    lines += ["; ".join(facts) + ".", ""]

    # overall: one row per method (and back-off / temperature variant), chain and tree side by side
    rows: dict[str, dict[str, dict[str, Any]]] = {}
    for name, r in runs.items():
        if name.startswith("baseline/"):
            continue
        label, mode, _ = split_run(name)
        rows.setdefault(label, {})[mode] = r
    modes = [mode for mode in ("chain", "tree") if any(mode in by_mode for by_mode in rows.values())]
    header = (["method"] + [f"speedup {mode}" for mode in modes] + [f"tokens/step {mode}" for mode in modes]
              + ["token match"])
    body = []
    for label, by_mode in rows.items():
        matches = [r["token_match"] for r in by_mode.values() if r.get("token_match") is not None]
        body.append([label]
                    + [ratio(by_mode[mode]["speedup"], by_mode[mode].get("speedup_ci95")) if mode in by_mode else "-"
                       for mode in modes]
                    + [number(by_mode[mode]["mean_tokens_per_step"]) if mode in by_mode else "-" for mode in modes]
                    + [number(min(matches), 3) if matches else "-"])
    lines += ["Speedup of decode tokens/s over plain decoding of the same artifact (the plain runs that bracket "
              "each method), tokens per verify step, and the share of tokens equal to plain decoding's:", ""]
    lines += table(header, body) + [""]

    per_task = {n: s for n, s in report.get("speedup_per_task", {}).items() if not n.startswith("baseline/")}
    if per_task:
        task_names = list(tasks) or list(next(iter(per_task.values())))
        lines += ["Speedup per Spec-Bench task:", ""]
        lines += table(["run"] + task_names,
                       [[name] + [ratio(speeds.get(t)) for t in task_names] for name, speeds in per_task.items()])
        lines.append("")

    roof = report.get("roofline")
    if roof:
        lines += ["Plain decoding against the memory roofline (read bandwidth probed on the machine, bytes read "
                  "per token):", ""]
        lines += table(["variant", "read GB/s", "MB/token", "ceiling tok/s", "plain tok/s", "of ceiling"],
                       [[v, number(r["bandwidth_gb_s"], 1), number(r["bytes_per_token"] / 1e6, 0),
                         number(r["ceiling_tokens_per_s"], 1), number(r["plain_tokens_per_s"], 1),
                         f"{r['fraction']:.0%}"] for v, r in roof.items()])
        lines.append("")
    return lines


def peers_section(m: Metrics, rel: str, report: dict[str, Any], level: str) -> list[str]:
    runs: dict[str, dict[str, Any]] = report["runs"]
    variant = Path(rel).stem.removeprefix("peers-")
    genai_plain = next((n for n in runs if n.startswith("ort-genai/") and n.endswith("/plain")), None)
    genai_ngram = next((n for n in runs if n.startswith("ort-genai/") and n.endswith("/ngram")), None)
    llama_plain = next((n for n in runs if n.startswith("llama.cpp/") and n.endswith("/plain")), None)
    llama_lookup = next((n for n in runs if n.startswith("llama.cpp/") and n.endswith("/prompt_lookup")), None)
    ratios = report.get("ratios", {})
    ci95 = report.get("ci95", {})
    rounds = report.get("round_ratios", {})
    lines = [f"{level} {variant} (`{m.name(rel)}`)", "",
             f"{report.get('prompts', '?')} prompts, {report.get('max_new_tokens', '?')} new tokens, "
             f"{threads_text(report.get('threads'))} threads, {report.get('rounds', 1)} round(s); token match: "
             "the share of tokens equal to specrt's plain decoding of the same variant.", ""]
    if llama_plain is not None:
        lines[-1:] = [f"llama.cpp (`{llama_plain.split('/')[1]}`) runs the weights stage's GGUF, plain and with its "
                      "prompt lookup; `own plain`: a speculative peer's token match against its own plain decoding "
                      "(1.000: lossless on these prompts).", ""]

    def versus(name: str, reference: str | None) -> str:
        if reference is None:
            return "-"
        if name == reference:
            return "1.00x"
        key = f"{name} / {reference}"
        value = ratios.get(key)
        if value is None:
            ref = runs[reference]["decode_tokens_per_s"]
            value = runs[name]["decode_tokens_per_s"] / ref if ref else None
        text = ratio(value, ci95.get(key) if isinstance(ci95, dict) else None)
        spread = rounds.get(key, [])
        if len(spread) > 1:
            text += f" (rounds {min(spread):.2f}-{max(spread):.2f})"
        return text

    header = ["run", "decode tok/s", "prefill s", "token match", "vs genai plain", "vs genai n-gram"]
    body = [[name, number(r["decode_tokens_per_s"], 1), number(r.get("prefill_s"), 1),
             number(r.get("token_match"), 3), versus(name, genai_plain), versus(name, genai_ngram)]
            for name, r in runs.items()]
    if llama_plain is not None:  # columns of their own only where the run had a llama.cpp peer
        header += ["vs llama.cpp plain", "vs llama.cpp lookup", "own plain"]
        for row, (name, r) in zip(body, runs.items(), strict=True):
            row += [versus(name, llama_plain), versus(name, llama_lookup), number(r.get("token_match_plain"), 3)]
    lines += table(header, body)
    return lines + [""]


def spec_safe_cell(spec_safe: bool | None) -> str:
    """A report's ``spec_safe``: None where no gate ran (the runtime self-checks such an artifact)."""
    return "self-check" if spec_safe is None else "yes" if spec_safe else "no"


def quantize_section(m: Metrics, files: Sequence[str]) -> list[str]:
    body = []
    for rel in files:
        r = m.load(rel)
        if r is None:
            continue
        q = r.get("quantization", {})
        body.append([r["model"], r["variant"], str(q.get("method", "-")), f"{r['bytes'] / 2**20:,.0f}",
                     f"{r['size_vs_source']:.0%}", spec_safe_cell(r.get("spec_safe")),
                     "not run" if r.get("gate_positions") is None else
                     f"{r['gate_disagreements']}/{r['gate_positions']}", number(r["top1_agreement"], 3),
                     number(r["mean_kl"], 4), number(r["decode_ms_per_token"], 1),
                     number(r["source_decode_ms_per_token"], 1), ratio(r["speedup_vs_source"])])
    if not body:
        return []
    lines = ["## Quantized variants", "",
             "Stage quantize: size and speed against the fp32 artifact, top-1 agreement and mean KL of the next-token "
             "distribution against fp32, and the spec-safety gate (argmax disagreements between verify windows and "
             "single steps over the positions checked):", ""]
    return lines + table(["model", "variant", "method", "MiB", "of fp32", "spec-safe", "gate flips", "top-1",
                          "mean KL", "ms/token", "fp32 ms/token", "speedup"], body) + [""]


def export_section(m: Metrics, files: Sequence[str]) -> list[str]:
    body = []
    for rel in files:
        r = m.load(rel)
        if r is None:
            continue
        parity, gate = r.get("parity", {}), r.get("gate", {})
        basis = gate.get("basis", {})
        body.append([r["model"], r.get("attention", "-"), f"{r['bytes'] / 2**20:,.0f}",
                     f"{parity.get('chain', {}).get('max_abs_diff', float('nan')):.1e}",
                     f"{parity.get('tree', {}).get('max_abs_diff', float('nan')):.1e}",
                     "ok" if parity.get("ok") else "FAIL",
                     f"{gate['disagreements']}/{gate['positions']}" if gate else "not run",
                     number(gate.get("max_logit_diff"), 1), spec_safe_cell(r.get("spec_safe")),
                     str(basis.get("exactness", "-"))])
    if not body:
        return []
    lines = ["## fp32 export", "",
             "Stage export: largest logit difference from torch (chain and tree windows), and the spec-safety gate on "
             "the fp32 graph (`exactness`: by construction, or measured on this machine):", ""]
    return lines + table(["model", "attention", "MiB", "parity chain", "parity tree", "parity", "gate flips",
                          "max logit diff", "spec-safe", "exactness"], body) + [""]


def lossless_section(m: Metrics, files: Sequence[str]) -> list[str]:
    reports = [(rel, r) for rel in files if (r := m.load(rel)) is not None]
    if not reports:
        return []
    columns = [f"{r.get('model', Path(rel).parent.name)} {r.get('variant', Path(rel).stem.removeprefix('lossless-'))}"
               for rel, r in reports]
    cells: dict[str, list[str]] = {}
    for i, (_, r) in enumerate(reports):
        by_method: dict[str, list[tuple[str, bool]]] = {}
        for name, run in r["runs"].items():
            method, _, mode = name.partition("/")
            by_method.setdefault(method, []).append((mode or "chain", bool(run["identical"])))
        for method, results in by_method.items():
            failed = [mode for mode, same in results if not same]
            cell = "pass" if not failed else (
                f"FAIL: {', '.join(failed)}" if r.get("spec_safe", True) else f"differs: {', '.join(failed)} (flagged)")
            cells.setdefault(method, ["-"] * len(reports))[i] = cell
    summary = [f"{col}: {'PASS' if r.get('lossless') else 'FAIL'} ({r.get('prompts', '?')} prompts, "
               f"{r.get('max_new_tokens', '?')} new tokens)" for col, (_, r) in zip(columns, reports, strict=True)]
    lines = ["## Lossless regression", "",
             "Stage lossless: every registered method, chain and tree, greedy, against plain decoding of the same "
             "variant; pass = every output equal token for token. " + "; ".join(summary) + ".", ""]
    return lines + table(["method"] + columns, [[method] + row for method, row in cells.items()]) + [""]


def pair_section(m: Metrics, files: Sequence[str]) -> list[str]:
    lines: list[str] = []
    for rel in files:
        r = m.load(rel)
        if r is None:
            continue
        if not lines:
            lines = ["## Draft/target pair", ""]
        lines += [f"### {r['draft']} ({r['draft_variant']}) drafting for {r['target']} ({r['variant']}) "
                  f"(`{m.name(rel)}`)", "",
                  f"{r['prompts']} prompts, {r['max_new_tokens']} new tokens, threads: "
                  f"{threads_text(r.get('threads'))}; baseline: {r.get('baseline', 'plain decoding of the target')}; "
                  f"t0 greedy, t1 temperature 1 (token match is defined for greedy runs only).", ""]
        lines += table(["run", "decode tok/s", "plain tok/s", "speedup", "tokens/step", "acceptance", "token match"],
                       [[name, number(x["decode_tokens_per_s"], 1), number(x["baseline_decode_tokens_per_s"], 1),
                         ratio(x["speedup"], x.get("speedup_ci95")), number(x["mean_tokens_per_step"]),
                         number(x.get("acceptance_rate")), number(x.get("token_match"), 3)]
                        for name, x in r["runs"].items()])
        per_task = {name: tasks for name, tasks in (r.get("per_task") or {}).items() if not name.startswith("baseline")}
        columns = [t for t in TASKS if any(t in tasks for tasks in per_task.values())]
        if columns:
            lines += ["", "Speedup per Spec-Bench task:", ""]
            lines += table(["run"] + columns,
                           [[name] + [ratio(tasks[t]["speedup"]) if t in tasks else "-" for t in columns]
                            for name, tasks in per_task.items()])
        lines.append("")
    return lines


def corpora_section(m: Metrics, files: Sequence[str]) -> list[str]:
    lines: list[str] = []
    for rel in files:
        r = m.load(rel)
        if r is None:
            continue
        sources = ", ".join(f"{s}: {x['tokens']:,} tokens" for s, x in r.get("sources", {}).items())
        lines += [f"## Retrieval datastore (`{m.name(rel)}`)", "",
                  f"{r['tokens']:,} tokens in {r['documents']:,} documents ({sources}); "
                  f"{r['bytes'] / 2**20:,.0f} MiB; built in {r['build_s']:.0f} s. Drafting from it on held-out "
                  "documents of each source:", ""]
        lines += table(["source", "method", "accepted/step", "propose ms (mean)", "propose ms (p99)"],
                       [[source, name, number(x["accepted_per_step"]), number(x["propose_mean_ms"], 3),
                         number(x["propose_p99_ms"], 3)]
                        for source, by_method in r.get("lookup", {}).items() for name, x in by_method.items()])
        lines.append("")
    return lines


def machine_lines(m: Metrics, export_files: Sequence[str], bench_files: Sequence[str]) -> list[str]:
    """What the metrics record about the machine: the gate's basis (CPU features, kernel code,
    onnxruntime, provider) and any ``machine`` entry of the benchmark metrics."""
    lines = []
    for rel in export_files:
        path = m.root / rel
        if not path.is_file():
            continue
        try:
            basis = json.loads(path.read_text()).get("gate", {}).get("basis", {})
        except ValueError:
            continue
        if basis:
            lines.append(f"- Machine (`{m.name(rel)}`, the spec-safety gate's basis): {basis.get('machine', '?')}, "
                         f"CPU features {', '.join(basis.get('cpu_features', [])) or '-'}, kernel code "
                         f"{basis.get('kernel_isa', '-')}, onnxruntime {basis.get('onnxruntime', '-')}, provider "
                         f"{basis.get('provider', '-')}")
            break
    for rel in bench_files:
        path = m.root / rel
        if not path.is_file():
            continue
        try:
            machine = json.loads(path.read_text()).get("machine")
        except ValueError:
            continue
        if isinstance(machine, dict) and machine:
            lines.append(f"- Machine (`{m.name(rel)}`): "
                         + ", ".join(f"{k} {', '.join(map(str, v)) if isinstance(v, list) else v}"
                                     for k, v in machine.items()))
    return lines


def full_files(root: Path) -> list[str]:
    patterns = (f"*/{FULL}/benchmark-*.json", f"*/{FULL}/peers-*.json", f"pair/{FULL}/bench-*.json")
    return sorted(str(p.relative_to(root)) for pattern in patterns for p in root.glob(pattern) if p.is_file())


def bench_and_peers(m: Metrics, bench: Sequence[str], peers: Sequence[str], level: str) -> list[str]:
    lines: list[str] = []
    loaded = [(rel, r) for rel in bench if (r := m.load(rel)) is not None]
    if loaded:
        lines += [f"{level} Spec-Bench: every method against plain decoding", ""]
        for rel, r in loaded:
            lines += benchmark_section(m, rel, r, level + "#")
    loaded = [(rel, r) for rel in peers if (r := m.load(rel)) is not None]
    if loaded:
        lines += [f"{level} Peers: onnxruntime-genai, llama.cpp and transformers on the same prompts", ""]
        for rel, r in loaded:
            lines += peers_section(m, rel, r, level + "#")
    return lines


def render(root: Path, params: dict[str, Any] | None, command: str = COMMAND) -> str:
    """The whole page."""
    m = Metrics(root)
    files = expected_files(params) if params is not None else discovered_files(root)
    full = full_files(root)
    model = (params or {}).get("models", [None])[0] or next(
        (f.split("/")[0] for f in files["benchmark"] + files["export"]), "?")

    body: list[str] = []
    if full:
        body += ["## Headline: the full benchmark (`dvc repro pipeline/full/dvc.yaml`)", ""]
        body += bench_and_peers(m, [f for f in full if "/benchmark-" in f], [f for f in full if "/peers-" in f], "##")
        body += pair_section(m, [f for f in full if f.startswith("pair/")])
        body += ["## Quick CI profile (`dvc repro`)", ""]
    else:
        body += [f"No full-benchmark metrics (`{m.name(f'<model>/{FULL}/')}`): `dvc repro pipeline/full/dvc.yaml` "
                 "writes them. The tables below are the quick CI profile of `dvc repro`: few prompts and short "
                 "answers, so a speedup moves by a few hundredths from run to run.", ""]
    body += bench_and_peers(m, files["benchmark"], files["peers"], "##")
    body += pair_section(m, files["pair"])
    body += lossless_section(m, files["lossless"])
    body += quantize_section(m, files["quantize"])
    body += export_section(m, files["export"])
    body += corpora_section(m, files["corpora"])
    weights = [r for rel in files["weights"] if (r := m.load(rel)) is not None]
    if weights:
        body += ["## Models", ""]
        body += table(["model", "weights", "GGUF MiB", "layers", "hidden", "vocabulary"],
                      [[w["model"], w.get("display_name", "-"), f"{w['gguf']['bytes'] / 2**20:,.0f}",
                        str(w["config"].get("num_hidden_layers", "-")), str(w["config"].get("hidden_size", "-")),
                        str(w["config"].get("vocab_size", "-"))] for w in weights]) + [""]

    head = ["# Results", "",
            f"<!-- Generated by `{command}`: do not edit by hand. -->", "",
            f"Generated by `{command}` from the pipeline's DVC metrics files; do not edit by hand: rebuild the "
            "artifacts (`dvc repro`, and `dvc repro pipeline/full/dvc.yaml` for the full benchmark) and run the "
            "command again. How the stages measure: `docs/benchmark.md`.", "",
            f"- Model: {model}"]
    head += machine_lines(m, files["export"], full + files["benchmark"])
    head.append("- Metrics files: " + ", ".join(f"`{f}`" for f in m.read) if m.read else "- Metrics files: none found")
    if m.missing:
        head.append("- Missing (their tables are left out): " + ", ".join(f"`{f}`" for f in m.missing))
    if m.unreadable:
        head.append("- Unreadable: " + ", ".join(m.unreadable))
    return "\n".join(head + [""] + body).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--artifacts", type=Path, default=Path("artifacts"), help="the pipeline's artifacts folder")
    parser.add_argument("--out", type=Path, default=Path("docs/results.md"), help="markdown file to write")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"),
                        help="names the metrics files to expect (absent: the files found)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    if not args.artifacts.is_dir():
        log.error("no artifacts folder at %s (run `dvc repro` first)", args.artifacts)
        return 1
    params = yaml.safe_load(args.params.read_text()) if args.params.is_file() else None
    page = render(args.artifacts, params)
    write_text_atomic(args.out, page)
    missing = [line for line in page.splitlines() if line.startswith("- Missing")]
    for line in missing:
        log.warning("%s", line.removeprefix("- "))
    log.info("wrote %s", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
