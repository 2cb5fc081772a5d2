"""The drafters' indexes: the data structures model-free drafters search for continuations.

    suffix_tree.py       a suffix tree over the request's text and past outputs (suffix decoding)
    suffix_automaton.py  suffix automata, dynamic per request and static over a corpus (SAM)
    datastore.py         a retrieval corpus on disk: tokens and their static automaton (REST, SAM)
    topk.py              top-k token ids per row, for adjacency tables (token recycling)

They know nothing of drafters, the engine or the backend.
"""
