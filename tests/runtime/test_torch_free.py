"""The runtime is torch-free: importing specrt and generating never loads torch or transformers."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import json, sys
import specrt
model = specrt.load(sys.argv[1])
result = model.generate("def add(", max_new_tokens=8, method="pld", tree=True)
print(json.dumps({"heavy": sorted(m for m in ("torch", "transformers", "onnx") if m in sys.modules),
                  "tokens": len(result.token_ids)}))
"""


def test_generate_leaves_torch_and_transformers_unloaded(runtime_artifact):
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(runtime_artifact)], capture_output=True, text=True,
                         check=True)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["heavy"] == []
    assert report["tokens"] > 0
