"""The backend: onnxruntime sessions over an exported decoder (the contract of specrt.backend.contract).

    session.py       DecoderSession (one loaded graph) and OrtDecoder (a KV cache on it): forward,
                     commit the accepted path, truncate
    kvstore.py       where the KV cache lives (host arrays or device buffers), gather.py and
                     binding.py its row moves and onnxruntime's I/O binding
    window.py        a draft tree as the window the decoder runs (ids, positions, attention bias) and
                     the cut a graph's attention imposes on branching trees (KEY_BLOCK)
    prefill.py       a prompt in chunks; draft_model.py a draft model's cache behind the drafters'
                     narrow protocol (specrt.drafters.base.DraftModel)
    manifest.py      the artifact folder and its checks; stamp.py remembers verified hashes
    kernels.py       specrt's onnxruntime custom operators (runtime/kernels/), verdict.py where a
                     spec-safety verdict holds, blas.py numpy's BLAS threads beside onnxruntime's

Nothing here imports the engine or the drafters.
"""
