"""Child processes that take Ctrl-C as a terminal user's would.

A job started in the background by a non-interactive shell (``nohup bash .ci/run &``) inherits SIGINT ignored, and
Python then installs no KeyboardInterrupt handler in its children: a test that sends a child SIGINT would see it
ignored. Children started with ``preexec_fn=sigint_as_at_a_terminal`` get the default disposition back.
"""

from __future__ import annotations

import signal


def sigint_as_at_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
