"""Live progress line for the solvers (stdlib only).

A solver calls :meth:`ProgressLine.update` once per outer iteration with a
record dict (the same dicts that end up in ``history_``)::

    epoch, time, primal, dual, gap, rel_gap, n_active, n_features,
    active_nnz, coef_nnz, inner_steps, bytes_sent, bytes_recv

Verbosity:

* ``verbose=0``: nothing is printed.
* ``verbose=1``: on a terminal, one line rewritten in place (``\\r`` plus an
  erase-to-end-of-line), in the style of tqdm / rich, ended by a newline on
  :meth:`close`.  When the stream is not a terminal (a log file, a pipe, CI)
  one plain line is printed at most every ``min_interval`` seconds, plus the
  last record on :meth:`close`, so that logs stay short.
* ``verbose>=2``: one line per update, always.
"""

from __future__ import annotations

import sys
import time as _time

__all__ = ["ProgressLine", "format_bytes", "format_record"]

_ERASE_EOL = "\x1b[K"


def format_bytes(n) -> str:
    """Human-readable byte count: ``0 B``, ``512 B``, ``1.5 kB``, ``12.0 MB``."""
    try:
        n = float(n)
    except (TypeError, ValueError):
        return "? B"
    if n < 1000:
        return f"{int(n)} B"
    for unit in ("kB", "MB", "GB", "TB"):
        n /= 1000.0
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}"
    return f"{n:.1f} TB"  # pragma: no cover


def _fmt_float(x, spec=".1e") -> str:
    try:
        return format(float(x), spec)
    except (TypeError, ValueError):
        return "?"


def _fmt_int(x) -> str:
    try:
        return f"{int(x):,}"
    except (TypeError, ValueError):
        return "?"


def format_record(record: dict, label: str = "ddss") -> str:
    """One-line summary of a progress record (missing keys are tolerated)."""
    parts = [label, f"epoch {record.get('epoch', 0):>3}"]
    gap = f"gap {_fmt_float(record.get('gap'))}"
    if record.get("rel_gap") is not None:
        gap += f" (rel {_fmt_float(record.get('rel_gap'))})"
    parts.append(gap)
    if record.get("n_active") is not None:
        act = f"active {_fmt_int(record.get('n_active'))}"
        if record.get("n_features") is not None:
            act += f"/{_fmt_int(record.get('n_features'))}"
        parts.append(act)
    if record.get("coef_nnz") is not None:
        parts.append(f"nnz(x) {_fmt_int(record.get('coef_nnz'))}")
    sent = record.get("bytes_sent", 0) or 0
    recv = record.get("bytes_recv", 0) or 0
    comm = f"sent {format_bytes(sent)}"
    if recv:
        comm += f" recv {format_bytes(recv)}"
    parts.append(comm)
    if record.get("newton_step"):
        parts.append(f"Newton step t={_fmt_float(record['newton_step'], '.3g')}")
    parts.append(f"{_fmt_float(record.get('time', 0.0), '.2f')} s")
    return " | ".join(parts)


class ProgressLine:
    """Progress display for an iterative solver.

    Parameters
    ----------
    verbose : int
        0 silent, 1 live line (throttled when not a TTY), >=2 one line per update.
    stream : file-like, optional
        Where to write; defaults to ``sys.stderr`` (looked up at call time).
    label : str
        Prefix of every line (e.g. the method name).
    min_interval : float
        Minimum seconds between two printed lines in non-TTY mode at verbose=1.
    """

    def __init__(self, verbose=0, stream=None, label="ddss", min_interval=1.0):
        self.verbose = int(verbose or 0)
        self._stream = stream
        self.label = label
        self.min_interval = float(min_interval)
        self._last_record = None
        self._last_printed = None  # the record last written (non-TTY mode)
        self._last_print_time = None
        self._live_len = 0  # length of the live line on screen (TTY mode)
        self._closed = False
        self._tty = None

    # -- helpers ---------------------------------------------------------
    @property
    def stream(self):
        return self._stream if self._stream is not None else sys.stderr

    def _is_tty(self) -> bool:
        if self._tty is None:
            try:
                self._tty = bool(self.stream.isatty())
            except (AttributeError, ValueError, OSError):
                self._tty = False
        return self._tty

    def _write(self, text: str) -> None:
        s = self.stream
        try:
            s.write(text)
            s.flush()
        except (AttributeError, ValueError, OSError):
            # A closed or broken stream must never break the solver.
            pass

    # -- public API ------------------------------------------------------
    def update(self, record: dict) -> None:
        """Show one outer-iteration record."""
        if self.verbose <= 0 or self._closed:
            return
        self._last_record = record
        line = format_record(record, self.label)
        if self.verbose >= 2:
            self._write(line + "\n")
            self._last_printed = record
            return
        if self._is_tty():
            self._write("\r" + line + _ERASE_EOL)
            self._live_len = len(line)
            return
        now = _time.monotonic()
        if (self._last_print_time is None
                or now - self._last_print_time >= self.min_interval):
            self._write(line + "\n")
            self._last_print_time = now
            self._last_printed = record

    def close(self) -> None:
        """Finish the display (newline after a live line, last record in logs)."""
        if self._closed:
            return
        self._closed = True
        if self.verbose <= 0:
            return
        if self.verbose == 1:
            if self._is_tty():
                if self._live_len:
                    self._write("\n")
            elif (self._last_record is not None
                  and self._last_record is not self._last_printed):
                self._write(format_record(self._last_record, self.label) + "\n")

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close()
        return False
