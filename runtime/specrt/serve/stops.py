"""Stop strings over streamed text: emit everything before the first stop string, never the stop
string itself, even when it arrives split over several pieces."""

from __future__ import annotations


class StopCutter:
    """Feed text pieces in order; get back what may be sent now. Text that could still be the
    beginning of a stop string is held back until the next piece decides it."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops = stops
        self.pending = ""  # held back: a suffix of the text so far that a stop string starts with
        self.stopped = False

    def push(self, piece: str) -> str:
        """The text that can be sent after ``piece``; once a stop string is found, ``stopped`` is
        True and everything from it on is dropped."""
        if self.stopped:
            return ""
        text = self.pending + piece
        found = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if found:
            self.stopped, self.pending = True, ""
            return text[: min(found)]
        hold = max((self._overlap(text, s) for s in self.stops), default=0)
        self.pending = text[len(text) - hold :]
        return text[: len(text) - hold]

    def flush(self) -> str:
        """The held-back text, at the end of the generation (no stop string completed it)."""
        rest, self.pending = self.pending, ""
        return "" if self.stopped else rest

    @staticmethod
    def _overlap(text: str, stop: str) -> int:
        """The length of the longest suffix of ``text`` that is a proper prefix of ``stop``."""
        for n in range(min(len(text), len(stop) - 1), 0, -1):
            if text.endswith(stop[:n]):
                return n
        return 0
