"""One section of params.yaml, the settings of one stage run.

The default DVC pipeline (dvc.yaml) reads the quick sections (``benchmark``, ``lossless``,
``peers``); the full measurement (pipeline/full/dvc.yaml) runs the same modules on the ``*_full``
sections, chosen by each module's ``--section``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def stage_params(path: Path, section: str) -> dict[str, Any]:
    """``params.yaml``'s mapping ``section``; a clear error naming the file and the sections it has
    when it is missing or not a mapping."""
    try:
        params = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise SystemExit(f"{path}: cannot read the stage parameters: {e}") from e
    if not isinstance(params, dict) or not isinstance(params.get(section), dict):
        have = ", ".join(k for k, v in params.items() if isinstance(v, dict)) if isinstance(params, dict) else "none"
        raise SystemExit(f"{path}: no section {section!r} (a mapping of settings); sections: {have}")
    return params[section]


def gated(gate: dict[str, Any], variant: str) -> bool:
    """Whether the spec-safety gate settings ``gate`` (a section of params.yaml) run on an artifact of
    ``variant``: every variant, unless the section names its ``variants``."""
    variants = gate.get("variants")
    return variants is None or variant in variants
