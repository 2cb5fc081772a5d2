#!/usr/bin/env bash
# One-shot check of the CUDA execution provider on a bare GPU machine, in under 8 minutes:
#
#   bash scripts/gpu_check.sh [WHEELS_DIR]        (run from anywhere; WHEELS_DIR defaults to ./wheels)
#
#   1. a fresh venv with onnxruntime-gpu (never next to the CPU onnxruntime), the runtime (--no-deps),
#      pytest, and what tests/tiny.py needs to build tiny artifacts (torch, transformers, onnx, ...);
#      wheels come from WHEELS_DIR when it has them, else from the package registry
#   2. the CUDA/cuDNN libraries of the nvidia-* wheels on LD_LIBRARY_PATH; a CUDA session must start
#   3. tests/test_backend_device.py: the device cache on the CPU EP and, the point, on the CUDA EP
#   4. scripts/gpu_bench.py: baseline vs pld (chain, tree) on a tiny portable artifact (the CUDA
#      provider cannot run SpecAttention): cuda, cuda+host, cpu
#
# Results under $OUT (default ./gpu_check_out): gpu_check.log, nvidia-smi.txt, pip-freeze.txt,
# onnxruntime.txt, junit-device.xml, bench.json. Exit status: 0 only if the CUDA tests ran and
# passed and every benchmark run was lossless.
#
# Environment: PYTHON (default python3), SPECRT_GPU_VENV (default /tmp/specrt-gpu-venv),
# TORCH_INDEX_URL (an index with CPU torch wheels; default: the registry's torch),
# SPECRT_BENCH_ARTIFACT (bench this artifact folder instead of a tiny one).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
OUT="${OUT:-$REPO/gpu_check_out}"
WHEELS="${1:-$REPO/wheels}"
VENV="${SPECRT_GPU_VENV:-/tmp/specrt-gpu-venv}"
WORK="$(mktemp -d /tmp/specrt-gpu-check.XXXXXX)"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_check.log") 2>&1

START=$SECONDS
step() { echo "[gpu_check +$((SECONDS - START))s] $*"; }
status=0

step "nvidia-smi"
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || echo "nvidia-smi failed (exit $?)" >> "$OUT/nvidia-smi.txt"
cat "$OUT/nvidia-smi.txt"

step "venv $VENV"
"${PYTHON:-python3}" -m venv "$VENV"
# shellcheck disable=SC1091
source "$VENV/bin/activate"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_DEFAULT_TIMEOUT="${PIP_DEFAULT_TIMEOUT:-30}" PIP_RETRIES="${PIP_RETRIES:-2}"

FIND_LINKS=""
if compgen -G "$WHEELS/*.whl" > /dev/null; then
    FIND_LINKS="$WHEELS"
    step "wheels from $WHEELS ($(ls "$WHEELS"/*.whl | wc -l) files), the registry for the rest"
fi

pip_install() {  # local wheels only first; then the registry (with the local wheels as extra links)
    if [ -n "$FIND_LINKS" ] && python -m pip install --quiet --no-index \
        --find-links "$FIND_LINKS" "$@"; then
        return 0
    fi
    python -m pip install --quiet ${FIND_LINKS:+--find-links "$FIND_LINKS"} "$@"
}

step "install onnxruntime-gpu (+ CUDA/cuDNN wheels), numpy, tokenizers, pytest"
pip_install "onnxruntime-gpu[cuda,cudnn]>=1.20" "numpy==2.4.6" "tokenizers==0.23.3" "threadpoolctl==3.8.0" "pytest==9.0.3"

step "install torch (CPU is enough: it only exports the tiny test models) and the export stack"
if [ -n "${TORCH_INDEX_URL:-}" ]; then
    python -m pip install --quiet --index-url "$TORCH_INDEX_URL" "torch==2.13.0" \
        || pip_install "torch==2.13.0"
else
    pip_install "torch==2.13.0"
fi
pip_install "transformers==5.24.0" "onnx==1.23.2" "onnxscript==0.7.2" "onnx-ir==1.1.0" "pyyaml==6.0.3" \
    "safetensors==0.8.0"

step "install the runtime without its dependencies (its onnxruntime requirement is the CPU package)"
pip_install --no-deps -e . || echo "editable install failed: the runtime runs from PYTHONPATH"
export PYTHONPATH="$REPO/runtime:$REPO${PYTHONPATH:+:$PYTHONPATH}"
if python -m pip show onnxruntime > /dev/null 2>&1; then  # something pulled the CPU package in: it shadows the GPU one
    step "the CPU onnxruntime got installed: removing it and re-laying onnxruntime-gpu"
    python -m pip uninstall --quiet -y onnxruntime
    pip_install --force-reinstall --no-deps "onnxruntime-gpu>=1.20"
fi
python -m pip freeze > "$OUT/pip-freeze.txt"

step "CUDA libraries of the nvidia-* wheels on LD_LIBRARY_PATH"
NV_LIBS="$(python - <<'EOF'
import glob, os, site
dirs = {os.path.dirname(p) for sp in site.getsitepackages()
        for p in glob.glob(os.path.join(sp, "nvidia", "**", "lib*.so*"), recursive=True)}
print(":".join(sorted(dirs)))
EOF
)"
export LD_LIBRARY_PATH="${NV_LIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"

step "onnxruntime must start a CUDA session"
if ! python - > "$OUT/onnxruntime.txt" 2>&1 <<'EOF'
import onnxruntime as ort
from specrt.backend.gather import RowGather
print("onnxruntime", ort.__version__, ort.get_device(), ort.get_available_providers())
session = RowGather("CUDAExecutionProvider")._session(1)
print("gather session providers:", session.get_providers())
assert session.get_providers()[0] == "CUDAExecutionProvider", "CUDA EP did not start"
EOF
then
    status=1
fi
cat "$OUT/onnxruntime.txt"

step "tests/test_backend_device.py (cpu and cuda), junit to $OUT/junit-device.xml"
timeout 330 python -m pytest -q -rs -p no:cacheprovider --basetemp "$WORK/pytest" \
    --junitxml "$OUT/junit-device.xml" tests/test_backend_device.py || status=1
python - "$OUT/junit-device.xml" <<'EOF' || status=1
import sys
import xml.etree.ElementTree as ET
cases = [c for c in ET.parse(sys.argv[1]).iter("testcase") if "-cuda" in c.get("name", "")]  # [arch-cuda...]
bad = [c.get("name") for c in cases if c.find("failure") is not None or c.find("error") is not None]
skipped = [c.get("name") for c in cases if c.find("skipped") is not None]
print(f"cuda test cases: {len(cases)}, failed {len(bad)}, skipped {len(skipped)}")
sys.exit(1 if not cases or bad or skipped else 0)
EOF

step "benchmark: baseline vs pld on cuda (device cache), cuda+host (numpy cache) and cpu"
ARTIFACT="${SPECRT_BENCH_ARTIFACT:-}"
if [ -z "$ARTIFACT" ]; then
    ARTIFACT="$(ls -d "$WORK"/pytest/tiny-portable-qwen2*/fp32 2> /dev/null | head -n 1 || true)"
fi
if [ -z "$ARTIFACT" ]; then  # the tests did not leave one: build it
    ARTIFACT="$WORK/tiny/qwen2/fp32"
    timeout 120 python -c "import sys; from pathlib import Path; from tests.tiny import build_tiny_artifact; \
build_tiny_artifact('qwen2', Path(sys.argv[1]), attention='portable')" "$ARTIFACT" || status=1
fi
timeout 150 python scripts/gpu_bench.py --artifact "$ARTIFACT" --providers cuda cuda+host cpu --max-new-tokens 64 \
    --rounds 3 --out "$OUT/bench.json" || status=1

step "done, status $status; results in $OUT"
ls -l "$OUT"
exit "$status"
