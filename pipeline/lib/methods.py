"""Which of specrt's registered methods a stage can run with what it was given.

The retrieval methods draft from the corpora stage's datastore; a run without one leaves them out
(or refuses them when they are asked for by name). The draft-model methods are the runtime's own
list, ``specrt.drafters.NEEDS_DRAFT``.
"""

from __future__ import annotations

RETRIEVAL = frozenset({"rest", "sam_decoding", "asam", "asam_verify"})  # methods that need a datastore
