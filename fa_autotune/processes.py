"""Entry points of child processes (the tuner's compile pool and device worker).

Triton fixes interpreted or compiled mode when it is imported (its own library functions
are built then), so each child chooses its mode here before anything imports Triton. This
module imports neither Triton nor PyTorch; the work a child does is imported only after the
mode is set, and by name (``"package.module:function"``, given by the caller), so this module
depends on nothing of the package's and no import circle runs through it.
"""
from __future__ import annotations

import ctypes
import importlib
import os
import signal
import sys
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

_PR_SET_PDEATHSIG = 1


def _child_of(parent: int) -> None:
    """Make this child die with its parent: the kernel kills it when the parent dies (Linux
    PR_SET_PDEATHSIG), even by SIGKILL, so a killed tune leaves no compile workers behind;
    Ctrl-C goes to the parent only, which stops the run and keeps what was measured."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)


#: Modules inside which a KeyboardInterrupt is deferred: raised in the middle of a SQLAlchemy
#: fetch it leaves a cursor SQLite has closed, and SQLAlchemy logs "Error closing cursor" with
#: a traceback on the user's terminal (a transaction it interrupts is rolled back either way).
DEFER_IN = ("sqlalchemy", "sqlite3", "alembic", "optuna.storages")
RETRY_S = 0.05


def _inside(frame, prefixes: tuple[str, ...]) -> bool:
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name.startswith(prefixes):
            return True
        frame = frame.f_back
    return False


class SigintGuard:
    """Ctrl-C that is not lost and leaves no traceback. Python raises KeyboardInterrupt
    wherever the main thread is when SIGINT arrives; inside a finalizer or a garbage-collector
    callback (SQLAlchemy registers those) the exception is printed as "ignored" and the run
    goes on, and inside a database call SQLAlchemy logs its own failure to clean up. While
    guarded, the handler records the signal; inside database code (:data:`DEFER_IN`) it
    raises nothing and signals the main thread again after :data:`RETRY_S` (which also wakes
    a wait it has gone on to) until it is out; :meth:`check` (between trials) raises a
    recorded one."""

    def __init__(self) -> None:
        self._hit = threading.Event()
        self._retry: threading.Timer | None = None
        self._pending = False  # a retry scheduled that has not sent its signal yet

    def _handler(self, signum, frame) -> None:
        self._hit.set()
        if _inside(frame, DEFER_IN):
            if not self._pending:  # one retry in flight at most
                self._pending = True
                self._retry = threading.Timer(RETRY_S, self._resend, (signum,))
                self._retry.daemon = True
                self._retry.start()
            return
        raise KeyboardInterrupt

    def _resend(self, signum: int) -> None:
        """The retry: no longer pending before its signal is sent, so the handler that signal
        runs schedules the next one (its timer thread may still be alive then: a check of
        Timer.is_alive() there lost the retry now and then, and with it the Ctrl-C)."""
        self._pending = False
        signal.pthread_kill(threading.main_thread().ident, signum)

    def check(self) -> None:
        if self._hit.is_set():
            raise KeyboardInterrupt

    @contextmanager
    def installed(self) -> Iterator["SigintGuard"]:
        """The handler for the duration, where Python's own one is in place on the main thread
        (elsewhere nothing changes: signal handlers belong to the main thread); the record and
        a pending retry are cleared on the way out."""
        self._hit.clear()
        ours = threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGINT) is signal.default_int_handler
        if ours:
            signal.signal(signal.SIGINT, self._handler)
        try:
            yield self
        finally:
            if ours:
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # a retry in flight finds nothing to raise
                if self._retry is not None:
                    self._retry.cancel()
                    self._retry.join()
                signal.signal(signal.SIGINT, signal.default_int_handler)
            self._retry = None
            self._pending = False
            self._hit.clear()  # a signal the run already answered (or ended under) is not raised later


def compiler_init(parent: int | None = None) -> None:
    """Pool initializer of processes that compile for a GPU (never interpreted); MLIR's crash
    reproducers (written straight to fd 2) are kept out of the user's terminal, since a
    failed compile is reported as a status with its message. ``parent``: the pid it must
    not outlive."""
    if parent is not None:
        _child_of(parent)
    os.environ.pop("TRITON_INTERPRET", None)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)


def resolve(name: str) -> Callable[..., Any]:
    """The function ``"package.module:function"`` names, importing its module now: a child
    resolves its work only after choosing Triton's mode."""
    module, _, attribute = name.partition(":")
    if not module or not attribute:
        raise ValueError(f"{name!r} is not 'package.module:function'")
    return getattr(importlib.import_module(module), attribute)


def device_server(conn, interpret: bool, parent: int | None, work: str) -> None:
    """The device worker's loop: run each job received on ``conn`` with ``work(job, device)``
    (named ``"package.module:function"``, resolved once Triton's mode is set) and send back
    its result, until None or a closed pipe."""
    if parent is not None:
        _child_of(parent)
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        os.environ.pop("TRITON_INTERPRET", None)
    execute = resolve(work)  # only now: it imports Triton

    device = "cpu" if interpret else "cuda"
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        conn.send(execute(job, device))
