"""The service in a thread of this process, on a free loopback port.

Tests drive a real browser against it and benchmarks/dashboard.py times real HTTP reads
through it; both need the same thing (the app from server.app.create_app, served by uvicorn
over real sockets, stopped cleanly), so it lives here rather than in a test module that a
benchmark would have to import. `tokenbench serve` (bench/cli/serve.py) is the foreground way.
"""

from __future__ import annotations

import socket
import threading
import time

STARTUP_WAIT_S = 30.0  # generous: a loaded 2-core machine starts uvicorn slowly


class LiveServer:
    """uvicorn serving `app` on 127.0.0.1 in a daemon thread; `url` to reach it, stop() to end.

    The listening socket is opened here (port 0) and handed to uvicorn, so no other process
    can take the port between choosing it and listening on it.
    """

    def __init__(self, app) -> None:
        import uvicorn

        sock = socket.create_server(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = app
        config = uvicorn.Config(app, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, name="tokenbench-live", daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + STARTUP_WAIT_S
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                sock.close()
                raise RuntimeError(f"uvicorn did not start on {self.url}")
            time.sleep(0.025)

    def stop(self) -> None:
        """Stop the job worker, then uvicorn; wait (briefly) for the thread to end."""
        self.app.state.tb.jobs.shutdown()
        self.server.should_exit = True
        self.thread.join(10)
