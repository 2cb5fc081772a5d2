"""The model-build pipeline: one module per DVC stage, over the library they share (``pipeline.lib``).

Stages (dvc.yaml, pipeline/full/dvc.yaml), each runnable without DVC as ``python -m pipeline.<stage>``:
``weights`` -> ``export`` -> ``quantize``; ``corpora``; ``lossless``, ``benchmark``, ``pair_bench``
and ``peers`` measure the artifacts; ``llama_build`` builds llama.cpp for the full profile's peers.
``summary`` and ``report`` read the stages' metrics. No stage imports another (``.importlinter``).
"""
