"""Ctrl-C (SIGINT) and SIGTERM stop a training loop where it can save, so a stopped run loses no finished step.

A loop marks the work it may throw away, a rollout or an evaluation, with ``with stop.abortable():``; a signal
there abandons that work at once, so the stop takes a moment whatever the step's length. Anywhere else (an update
under way, a checkpoint being written) the signal is noted and the loop stops at its next ``stop.check()``, once
that work is done: the update of a step is never cut in half. The loop then saves a checkpoint and raises
:class:`TrainingInterrupted`; run again, it continues from there. A second signal quits at once, without saving.

Usage::

    with StopOnSignal() as stop:
        try:
            while step < total_steps:
                stop.check()
                with stop.abortable():
                    batch = rollout()        # thrown away on a signal
                update(batch)                # finished first
        except StopRequested:
            path = save_checkpoint()
            raise TrainingInterrupted(stop.requested, step, total_steps, path) from None
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

__all__ = ["StopOnSignal", "StopRequested", "TrainingInterrupted"]


class StopRequested(BaseException):
    """A signal asked the loop to stop: raised out of an abortable section, or by ``check()``.

    A ``BaseException``, so the ``except Exception`` of an env or a backend does not swallow it.
    """

    def __init__(self, signal_number: int) -> None:
        super().__init__(signal_number)
        self.signal_number = signal_number


class TrainingInterrupted(KeyboardInterrupt):
    """A training run stopped by a signal after saving a checkpoint of its last finished step.

    A ``KeyboardInterrupt``, so code that does not look for it stops as it did before. ``exit_status`` is the
    shell's status for the signal (130 for Ctrl-C, 143 for SIGTERM).
    """

    def __init__(self, signal_number: int, step: int, total_steps: int, checkpoint: Path | None) -> None:
        self.signal_number, self.step, self.total_steps, self.checkpoint = signal_number, step, total_steps, checkpoint
        saved = f"a checkpoint of it is in {checkpoint}" if checkpoint else "nothing was saved"
        super().__init__(f"{signal.Signals(signal_number).name} at step {step} of {total_steps}: {saved}")

    @property
    def exit_status(self) -> int:
        return 128 + self.signal_number


class StopOnSignal:
    """While entered (in the main thread), SIGINT and SIGTERM ask the loop to stop instead of killing it.

    Out of the main thread, where Python lets no code handle signals, it changes nothing.
    """

    def __init__(self, signals: Sequence[int] = (signal.SIGINT, signal.SIGTERM)) -> None:
        self.signals = tuple(signals)
        self.requested: int | None = None  # the first signal received
        self._abortable = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for number in self.signals:
                self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._restore()

    def _restore(self) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()

    def _handle(self, number: int, frame: FrameType | None) -> None:
        if self.requested is not None:  # the second signal: the user will not wait for the save
            self._restore()
            raise KeyboardInterrupt
        self.requested = number
        if self._abortable:
            self._abortable = False
            raise StopRequested(number)
        # os.write, not print: a handler that prints while the loop prints (the progress bar) can raise
        os.write(2, f"\n{signal.Signals(number).name}: stopping once the work under way (an update, a save) is done, "
                    "then saving a checkpoint; a second signal quits at once, without saving\n".encode())

    @contextlib.contextmanager
    def abortable(self) -> Iterator[None]:
        """Work a signal may abandon (raises :class:`StopRequested` at once, and on entry if one came)."""
        self.check()
        self._abortable = True
        try:
            yield
        finally:
            self._abortable = False

    def hold(self) -> None:
        """From here on, the current abortable work must finish (e.g. at the first optimizer step of an update)."""
        self._abortable = False

    def check(self) -> None:
        """Raise :class:`StopRequested` if a signal came."""
        if self.requested is not None:
            raise StopRequested(self.requested)
