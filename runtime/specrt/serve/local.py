"""The app on a free loopback port in a background thread: for tests, benchmarks and apps that
embed the server in their own process (``specrt serve`` runs uvicorn in the foreground instead)."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LocalServer:
    port: int  # on 127.0.0.1
    server: Any  # uvicorn.Server
    thread: threading.Thread

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ask the server to exit and wait for its thread."""
        self.server.should_exit = True
        self.thread.join(timeout=timeout_s)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_in_thread(app: Any, timeout_s: float = 60.0) -> LocalServer:
    """Start ``app`` (``build_app``'s) under uvicorn on a free loopback port; return once it accepts
    connections, or raise RuntimeError when it did not start within ``timeout_s``."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the server on 127.0.0.1:{port} did not start within {timeout_s:g} s")
        time.sleep(0.02)
    return LocalServer(port, server, thread)
