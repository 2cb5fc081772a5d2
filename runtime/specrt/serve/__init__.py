"""``specrt serve``: an OpenAI-compatible HTTP server on one loaded model (the ``serve`` extra:
starlette + uvicorn; the rest of specrt never imports them).

    specrt serve --model artifacts/qwen2.5-coder-0.5b-instruct/int4 --port 8000

Modules: :mod:`.requests` checks request bodies, :mod:`.generation` runs one request step by
step, :mod:`.stops` cuts stop strings, :mod:`.app` is the ASGI app, :mod:`.errors` OpenAI's error
shape, :mod:`.local` runs the app in a background thread.
"""

from specrt.serve.app import ServeConfig, build_app
from specrt.serve.local import LocalServer, serve_in_thread
from specrt.serve.requests import Speculation

__all__ = ["LocalServer", "ServeConfig", "Speculation", "build_app", "serve_in_thread"]
