"""Print what ``dvc repro`` built: per model and variant, the artifact size and the checks' verdicts.

    python -m pipeline.summary artifacts

Not a DVC stage: it only reads the manifests and stage reports under the artifacts folder.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specrt.errors import ArtifactError
from specrt.manifest import MANIFEST_NAME, read_manifest


def rows(root: Path) -> list[dict[str, str]]:
    out = []
    for manifest_path in sorted(root.glob(f"*/*/{MANIFEST_NAME}")):
        folder = manifest_path.parent
        try:
            manifest = read_manifest(folder, check_hashes=False)
        except ArtifactError as e:
            out.append({"artifact": str(folder), "size": "-", "parity": "-", "lossless": f"BROKEN: {e}"})
            continue
        parity = manifest.checks.get("parity", {})
        max_diff = parity.get("chain", {}).get("max_abs_diff", float("nan"))
        lossless_path = folder.parent / "lossless.json"
        lossless = json.loads(lossless_path.read_text()) if lossless_path.is_file() else None
        if lossless is None:
            verdict = "not run"
        else:
            runs = lossless["runs"]
            same = sum(r["identical"] for r in runs.values())
            verdict = f"{'PASS' if lossless['lossless'] else 'FAIL'} ({same}/{len(runs)} method runs identical)"
        out.append({
            "artifact": str(folder),
            "size": f"{sum(f.bytes for f in manifest.files.values()) / 2**20:,.0f} MiB",
            "parity": f"{'ok' if parity.get('ok') else 'FAIL'} (max |dlogit| {max_diff:.1e})",
            "lossless": verdict,
        })
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("artifacts", type=Path, nargs="?", default=Path("artifacts"))
    args = parser.parse_args(argv)
    table = rows(args.artifacts)
    if not table:
        print(f"no artifacts under {args.artifacts} (run `dvc repro` first)", file=sys.stderr)
        return 1
    keys = ["artifact", "size", "parity", "lossless"]
    widths = {k: max(len(k), *(len(r[k]) for r in table)) for k in keys}
    print("  ".join(k.ljust(widths[k]) for k in keys))
    for r in table:
        print("  ".join(r[k].ljust(widths[k]) for k in keys))
    return 0 if all("FAIL" not in r["parity"] + r["lossless"] and "BROKEN" not in r["lossless"] for r in table) else 1


if __name__ == "__main__":
    sys.exit(main())
