"""Stopping a training run on request without losing a step.

Ctrl-C (SIGINT) or SIGTERM (``kill``, ``timeout``, a batch scheduler, torchrun passing a
signal on) while :meth:`Trainer.fit` runs does not stop it in the middle of a step: the step
finishes, ``last/`` is saved at it, and then the run stops with ``KeyboardInterrupt``, so
``attnlab train --resume`` goes on from exactly that step. A second signal stops at once
(``KeyboardInterrupt`` where the program is; ``last/`` then holds the checkpoint before).

Under torchrun the processes agree on when to stop (:func:`any_process`): one of them being
signalled stops them all after the same step.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType, TracebackType

log = logging.getLogger(__name__)
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """While inside: the first SIGINT or SIGTERM is noted in :attr:`received` (the loop
    stops at the next step boundary), the second raises ``KeyboardInterrupt``.

    A signal the process ignores (``nohup`` ignores SIGHUP only; a background job of a
    non-interactive shell ignores SIGINT) stays ignored. Outside the main thread, where
    Python cannot install handlers, nothing changes.
    """

    def __init__(self) -> None:
        self.received: str | None = None  # the first signal's name
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.received is not None:
            raise KeyboardInterrupt(f"{name} again")
        self.received = name
        log.warning("%s: stopping after this step, once its checkpoint is saved "
                    "(send it again to stop at once)", name)

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                if signal.getsignal(s) is not signal.SIG_IGN:
                    self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()
