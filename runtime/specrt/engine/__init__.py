"""The engine: the speculative loop over one decoder and one drafter.

    loop.py          prefill, then per step: draft -> fit the window -> verify -> accept -> commit
    accept.py        the accept rules (greedy, recursive rejection sampling, sd, hsd, hsd_capped) and
                     their one dispatcher, whose result names accepted / recovered / bonus tokens
    prefix_cache.py  prompt prefixes whose KV and hidden states later requests reuse
    spec_gate.py     the spec-safety gate: verify windows against single steps, argmax for argmax

The engine drives the backend (specrt.backend) and the drafters (specrt.drafters); neither of those
imports it. The cost of a verify window by size (specrt.cost) and the back-off that cuts a draft to the
prefix that pays for it (specrt.backoff) sit below both: the engine and the ``auto`` controller
(specrt.drafters.auto) decide with them.
"""
