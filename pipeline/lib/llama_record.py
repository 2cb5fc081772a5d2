"""The ``llama_cpp`` stage's build record: its file name, the CPU it was built on, and its reader.

The stage (``python -m pipeline.llama_build``) writes ``llama_build.json`` into its output folder;
the peers stage reads it back before it runs llama.cpp from that folder. The record lives here,
apart from both stages, so that neither imports the other.
"""

from __future__ import annotations

import contextlib
import json
import logging
import platform
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

RECORD = "llama_build.json"


def cpu_model() -> str:
    """This machine's CPU model name (``/proc/cpuinfo``, else ``platform.processor()``): a
    ``GGML_NATIVE`` build targets the CPU it was built on."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def read_record(folder: Path) -> dict[str, Any]:
    """The build record of a ``llama_cpp`` stage output; an error when the folder holds no built
    package, a warning when it was built on another CPU model (``GGML_NATIVE``)."""
    path = Path(folder) / RECORD
    if not path.is_file():
        raise FileNotFoundError(f"{folder}: no {RECORD}; build it with `python -m pipeline.llama_build`")
    record = json.loads(path.read_text())
    if not record.get("built"):
        raise ValueError(f"{folder}: llama.cpp was not built (llama_cpp.enabled was false in its params section)")
    if record.get("cpu") != (here := cpu_model()):
        log.warning("%s was built on a %s, this is a %s: its -march=native code may not suit this CPU "
                    "(rebuild: dvc repro -f llama_cpp)", folder, record.get("cpu"), here)
    return record
