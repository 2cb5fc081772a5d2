"""Print what ``dvc repro`` built: per model and variant, the size, the checks' and the regression
verdicts; then the benchmark's best method, our ratios over the peers, and the draft/target pair
benchmark (``artifacts/pair``), for the stages that ran; last, each stage's wall time (the
``stage_s`` its report records) and their sum.

    python -m pipeline.summary artifacts

Not a DVC stage: it only reads the manifests and stage reports under the artifacts folder.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specrt.backend.manifest import MANIFEST_NAME, read_manifest
from specrt.errors import ArtifactError


def _lossless_verdict(path: Path) -> str:
    if not path.is_file():
        return "not run"
    report = json.loads(path.read_text())
    runs = report["runs"]
    same = sum(r["identical"] for r in runs.values())
    if report["lossless"]:
        return f"PASS ({same}/{len(runs)} method runs identical)"
    # a variant the gate flagged may diverge: reported, not failed (the stage exits 0 for it)
    return f"{'DIVERGES (flagged)' if not report.get('spec_safe', True) else 'FAIL'} ({same}/{len(runs)} identical)"


def rows(root: Path) -> list[dict[str, str]]:
    out = []
    for manifest_path in sorted(root.glob(f"*/*/{MANIFEST_NAME}")):
        folder = manifest_path.parent
        try:
            manifest = read_manifest(folder, check_hashes=False)
        except ArtifactError as e:
            out.append({"artifact": str(folder), "size": "-", "checks": "-", "lossless": f"BROKEN: {e}"})
            continue
        checks = [f"attention {manifest.attention}"]
        parity = manifest.checks.get("parity")
        if parity:
            max_diff = parity.get("chain", {}).get("max_abs_diff", float("nan"))
            checks.append(f"parity {'ok' if parity.get('ok') else 'FAIL'} ({max_diff:.1e})")
        quality = manifest.checks.get("fidelity")
        if quality:
            checks.append(f"top-1 {quality['top1_agreement']:.3f}, KL {quality['mean_kl']:.4f}")
        gate = manifest.checks.get("gate")
        checks.append("gate: not run" if gate is None else
                      f"spec_safe={manifest.spec_safe} ({gate['disagreements']}/{gate['positions']} flips)")
        out.append({
            "artifact": str(folder),
            "size": f"{sum(f.bytes for f in manifest.files.values()) / 2**20:,.0f} MiB",
            "checks": "; ".join(checks),
            "lossless": _lossless_verdict(folder.parent / f"lossless-{manifest.variant}.json"),
        })
    return out


def pair_rows(root: Path) -> list[str]:
    """One line per pair_bench run: variant, run, decode tok/s, speedup over the target's plain decoding."""
    lines = []
    for path in sorted((root / "pair").glob("bench-*.json")):
        report = json.loads(path.read_text())
        for name, r in report["runs"].items():
            match = "" if r["token_match"] is None else f", token match {r['token_match']:.3f}"
            lines.append(f"{report['draft']} -> {report['target']} [{report['variant']}] {name}: "
                         f"{r['decode_tokens_per_s']:.2f} tok/s, {r['speedup']:.2f}x, "
                         f"{r['mean_tokens_per_step']:.2f} tokens/step{match}")
    return lines


def benchmark_rows(root: Path) -> list[str]:
    """The benchmark stage's best run per model and variant, and our ratios over the peers."""
    lines = []
    for path in sorted(root.glob("*/benchmark-*.json")):
        report = json.loads(path.read_text())
        if report.get("best"):
            best = report["runs"][report["best"]]
            lines.append(f"{report['model']} [{report['variant']}] Spec-Bench ({report['prompts']} prompts): best "
                         f"{report['best']} {best['speedup']:.2f}x over plain decoding, token match "
                         f"{best['token_match']:.3f}"
                         + (f", baseline drift {best['baseline_drift']:+.0%}" if "baseline_drift" in best else ""))
    for path in sorted(root.glob("*/peers-*.json")):  # one per variant of the peers stage
        ratios = json.loads(path.read_text())["ratios"]
        lines += [f"{path.parent.name}: {name} = {ratio:.2f}" for name, ratio in ratios.items()]
    return lines


def stage_times(root: Path) -> list[tuple[str, float]]:
    """(report path under ``root``, seconds) of every stage report that records ``stage_s``, in
    the order the stages last ran (the reports' modification times)."""
    found = []
    for path in [*root.glob("*/*.json"), *root.glob("*/full/*.json")]:
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(report, dict) and isinstance(report.get("stage_s"), (int, float)):
            found.append((path.stat().st_mtime, str(path.relative_to(root)), float(report["stage_s"])))
    return [(name, seconds) for _, name, seconds in sorted(found)]


def time_lines(times: list[tuple[str, float]]) -> list[str]:
    """One line per stage report, minutes, then their sum."""
    width = max(len("total"), *(len(name) for name, _ in times))
    lines = [f"{name.ljust(width)}  {seconds / 60:5.1f} min" for name, seconds in times]
    return lines + [f"{'total'.ljust(width)}  {sum(s for _, s in times) / 60:5.1f} min"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("artifacts", type=Path, nargs="?", default=Path("artifacts"))
    args = parser.parse_args(argv)
    table = rows(args.artifacts)
    if not table:
        print(f"no artifacts under {args.artifacts} (run `dvc repro` first)", file=sys.stderr)
        return 1
    keys = ["artifact", "size", "checks", "lossless"]
    widths = {k: max(len(k), *(len(r[k]) for r in table)) for k in keys}
    print("  ".join(k.ljust(widths[k]) for k in keys))
    for r in table:
        print("  ".join(r[k].ljust(widths[k]) for k in keys))
    bench = benchmark_rows(args.artifacts)
    if bench:
        print("\nbenchmark and peers (decode tok/s ratios, same run):")
        print("\n".join(bench))
    pair = pair_rows(args.artifacts)
    if pair:
        print("\ndraft-model speculative decoding vs plain decoding of the target (pair_bench):")
        print("\n".join(pair))
    times = stage_times(args.artifacts)
    if times:
        print("\nstage wall times (each report's stage_s):")
        print("\n".join(time_lines(times)))
    return 0 if all("FAIL" not in r["checks"] + r["lossless"] and "BROKEN" not in r["lossless"] for r in table) else 1


if __name__ == "__main__":
    sys.exit(main())
