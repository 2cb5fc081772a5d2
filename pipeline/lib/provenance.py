"""What an artifact's manifest records of how it was built: the producers' versions and the graph's operators.

The export stage writes both for the fp32 graph, the quantize stage again for each variant it
derives from it.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import onnx

PRODUCERS = ("torch", "transformers", "onnx", "onnxscript", "onnxruntime", "tokenizers", "numpy")


def graph_op_types(path: Path) -> set[str]:
    """The operator types of the ONNX graph at ``path`` (its weights are not read)."""
    return {node.op_type for node in onnx.load(path, load_external_data=False).graph.node}


def producer_versions() -> dict[str, str]:
    versions = {}
    for pkg in PRODUCERS:
        try:
            versions[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            pass
    return versions
