"""Cancelling a request from another thread, or giving it a deadline.

    token = CancelToken(timeout_s=30)       # or CancelToken() with no deadline
    loop, chunks = model.stream_ids(ids, cancel=token)
    ...                                     # any thread, any time:
    token.cancel()

The loop checks the token before each prefill pass (a long prompt is prefilled in chunks of
``prefill_chunk`` positions) and before each verify step, so a request stops within one pass of its
cancellation or deadline, even in the middle of its prefill. It then ends like a finished request
(its iterator is exhausted, its KV cache given back) with ``finish_reason`` "cancelled" or
"timeout"; the tokens already emitted are those of the uncancelled run.
"""

from __future__ import annotations

import threading
import time

from specrt.errors import InvalidRequestError, check_number

CANCELLED = "cancelled"
TIMEOUT = "timeout"


class CancelToken:
    """Set by :meth:`cancel` (thread-safe) or by its deadline, ``timeout_s`` seconds after it was made."""

    def __init__(self, timeout_s: float | None = None):
        self._event = threading.Event()
        self.deadline: float | None = None  # time.monotonic() at which the request times out
        if timeout_s is not None:
            seconds = check_number("timeout_s", timeout_s)
            if seconds < 0:
                raise InvalidRequestError(f"timeout_s must be >= 0, got {timeout_s}")
            self.deadline = time.monotonic() + seconds

    def cancel(self) -> None:
        self._event.set()

    def reason(self) -> str | None:
        """"cancelled", "timeout", or None while the request may go on."""
        if self._event.is_set():
            return CANCELLED
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return TIMEOUT
        return None
