"""A WSGI app served by waitress on a thread of the test process (a free port on 127.0.0.1), and stopped cleanly.

Closing a waitress server from the test's thread closes its sockets while the server's thread may be in select() on
them: that thread then dies with EBADF (pytest's PytestUnhandledThreadExceptionWarning). So `close()` closes every
socket on the server's own loop thread -- a function sent through waitress's trigger runs there -- and the loop ends
with nothing left to watch; then the request threads stop."""
from __future__ import annotations

import threading

import waitress


class ThreadedWaitress:
    def __init__(self, app, threads: int = 4, **kw) -> None:
        self.server = waitress.create_server(app, host="127.0.0.1", port=0, threads=threads, **kw)
        self.url = f"http://127.0.0.1:{self.server.effective_port}"
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()

    def _close_all(self) -> None:   # on the loop thread
        for channel in list(self.server.active_channels.values()):
            channel.close()
        self.server.close()

    def close(self, timeout: float = 10.0) -> None:
        self.server.trigger.pull_trigger(self._close_all)
        self.thread.join(timeout)
        self.server.task_dispatcher.shutdown(timeout=timeout)
