"""Entry points of child processes (the tuner's compile pool and device worker).

Triton fixes interpreted or compiled mode when it is imported (its own library functions
are built then), so each child chooses its mode here before anything imports Triton. This
module imports neither Triton nor PyTorch; the work a child does is imported only after the
mode is set.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys

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


def device_server(conn, interpret: bool, parent: int | None = None) -> None:
    """The device worker's loop: run each job received on ``conn`` (correctness gate, then
    timing) and send back its result, until None or a closed pipe."""
    if parent is not None:
        _child_of(parent)
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        os.environ.pop("TRITON_INTERPRET", None)
    from .tune.worker import execute  # only now: it imports Triton

    device = "cpu" if interpret else "cuda"
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        conn.send(execute(job, device))
