"""One request's generation, step by step: the model's token chunks turned into text pieces,
cut at the request's stop strings and stop token ids. Synchronous (each step is one verify pass); the app runs the
steps on worker threads and closes the generation when its client goes away."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from specrt.cancel import CANCELLED, TIMEOUT, CancelToken
from specrt.logprobs import TokenLogprob
from specrt.model import SpecModel, TextStream
from specrt.serve.requests import GenerationRequest
from specrt.serve.stops import StopCutter


class Generation:
    """Iterate with :meth:`step` until ``done``; :meth:`close` frees the KV cache at any point.
    The request's ``timeout_s`` (if any) is a deadline from construction: a step that meets it ends the
    generation (finish_reason "timeout"), keeping the tokens emitted before it.

    :meth:`cancel` may be called from any thread while a step runs (a long prefill included): the
    step returns within one forward pass, and the generation is done."""

    def __init__(self, model: SpecModel, request: GenerationRequest):
        spec = request.speculation
        self.request = request
        self.token = CancelToken(timeout_s=request.timeout_s)  # the deadline runs from here: prefill included
        self._stepping = threading.Lock()  # held by the running step; close() waits for it
        self.loop, self._chunks = model.stream_ids(
            list(request.prompt_ids), max_new_tokens=request.max_tokens, method=spec.method, tree=spec.tree,
            temperature=request.temperature, top_p=request.top_p, seed=request.seed, draft_budget=spec.draft_budget,
            cancel=self.token, logprobs=request.logprobs,
        )
        self._tokenizer = model.tokenizer
        self._reported = 0  # tokens whose logprobs take_logprobs returned
        self._text = TextStream(model.tokenizer)
        self._stops = StopCutter(request.stop)
        self.token_ids: list[int] = []  # every token the model emitted (an EOS or a stop token included)
        self.stop_token = False  # ended at one of the request's stop_token_ids
        self.done = False

    def step(self) -> str:
        """Run one step; the text it lets out (may be empty). Sets ``done`` at the end: EOS, the
        token limit or the context's end, a stop string, or a cancellation."""
        with self._stepping:
            return self._step()

    def _step(self) -> str:
        if self.done:
            return ""
        chunk = next(self._chunks, None)
        if chunk is None:
            self.done = True
            return self._stops.push(self._text.finish()) + self._stops.flush()
        hit = np.flatnonzero(np.isin(chunk, self.request.stop_token_ids))
        if len(hit):  # a stop token: keep it in token_ids, not its text
            self.token_ids.extend(int(t) for t in chunk[: hit[0] + 1])
            self.stop_token = True
            piece = self._stops.push(self._text.push(chunk[: hit[0]]) + self._text.finish())
            self._close()
            return piece if self._stops.stopped else piece + self._stops.flush()
        self.token_ids.extend(int(t) for t in chunk)
        piece = self._stops.push(self._text.push(chunk))
        if self._stops.stopped:
            self._close()
        return piece

    def cancel(self) -> None:
        """Stop the generation at its next check (thread-safe; a running step returns soon)."""
        self.token.cancel()

    def close(self) -> None:
        """End the generation (stop string, client gone) and give its KV cache back; a step running
        on another thread is cancelled and waited for."""
        self.token.cancel()
        with self._stepping:
            self._close()

    def _close(self) -> None:
        self.done = True
        self._chunks.close()

    @property
    def cancelled(self) -> bool:
        return self.loop.finish_reason == CANCELLED

    @property
    def finish_reason(self) -> str:
        """OpenAI's "stop" (EOS, a stop string or a stop token) or "length" (max_tokens or the context's
        end); or "timeout": the request's deadline ended it first (not one of OpenAI's values; the
        official clients pass it through)."""
        if self._stops.stopped or self.stop_token or self.loop.finish_reason == "eos":
            return "stop"
        return TIMEOUT if self.loop.finish_reason == TIMEOUT else "length"

    def take_logprobs(self) -> list[TokenLogprob]:
        """The logprobs of the tokens of ``token_ids`` not returned before (none when not asked)."""
        got = self.loop.logprobs[self._reported : len(self.token_ids)]
        self._reported += len(got)
        return got

    def token_text(self, token_id: int) -> str:
        return self._tokenizer.decode([token_id], skip_special_tokens=False)

    def usage(self) -> dict[str, int]:
        prompt, completion = len(self.request.prompt_ids), len(self.token_ids)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def report(self) -> dict[str, Any]:
        """The response's ``specrt`` object: how the request was speculated and how fast it ran."""
        spec, stats = self.request.speculation, self.loop.stats
        return {
            "method": spec.method,
            "tree": spec.tree,
            "draft_budget": spec.draft_budget,
            "tokens_per_step": round(stats.tokens_per_step, 4),
            "decode_tokens_per_s": round(stats.decode_tokens_per_s, 3),
            "steps": stats.steps,
            "prefill_s": round(stats.prefill_s, 6),
            "cached_prompt_tokens": stats.cached_prompt_tokens,
            "token_ids": list(self.token_ids),
        }
