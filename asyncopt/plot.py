"""A picture of a run: the duality gap against time and epochs, and the features left.

:func:`plot_history` draws the history records of a fit (an estimator's ``history_``, or
the file that the command lines' ``--history`` or ``--history-json`` writes);
``asyncopt-plot`` (``asyncopt/cli/plot.py``) is its command line. matplotlib, an
optional dependency, is imported only when a figure is drawn.
"""

from __future__ import annotations

import json
import os

import numpy as np

__all__ = ["plot_history", "read_history"]

FIGSIZE = (13.0, 3.8)      # inches: three panels side by side
GAP_KEYS = ("rel_gap", "gap")
# the third panel's series: (record key, legend label, line style)
COUNTS = (
    ("n_active", "active (left by screening)", {"marker": "o", "markersize": 3}),
    ("coef_nnz", "non-zero coefficients", {"marker": "o", "markersize": 3}),
    ("working_set", "working set", {"linestyle": "none", "marker": "s", "markersize": 4}),
)
# counts up to this are drawn on a linear axis, larger ones on a symmetric log axis
LINEAR_COUNTS = 100


def _pyplot():
    """matplotlib.pyplot, or an ImportError that says how to install it."""
    try:
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("plotting a history needs matplotlib: pip install matplotlib "
                          f"({exc})") from exc
    return plt


def read_history(path):
    """Read the history records that ``--history`` or ``--history-json`` wrote.

    Parameters
    ----------
    path : str or os.PathLike
        A file of JSON lines, one record (a JSON object) a line, as ``--history``
        writes; or one JSON list of records, as ``--history-json`` writes. Blank lines
        are skipped.

    Returns
    -------
    list of dict
        The records, in the file's order.

    Raises
    ------
    OSError
        The file cannot be read (it does not exist, it is a folder, ...).
    ValueError
        The file holds no record, or a line (an element) is not JSON or not a JSON
        object; the message names the file and the line.
    """
    name = os.fspath(path)
    with open(path, "rb") as f:
        data = f.read()
    if not data.strip():
        raise ValueError(f"{name}: empty file, no history records")
    if data.lstrip().startswith(b"["):              # --history-json: one JSON list
        try:
            records = json.loads(data)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name}, line {exc.lineno}: not JSON ({exc.msg})") from None
        except UnicodeDecodeError:
            raise ValueError(f"{name}: not a text file") from None
        lines = [None] * len(records)
    else:                                           # --history: JSON lines
        records, lines = [], []
        for number, line in enumerate(data.splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8"
                raise ValueError(f"{name}, line {number}: not JSON ({reason})") from None
            lines.append(number)
    for index, (record, number) in enumerate(zip(records, lines)):
        if not isinstance(record, dict):
            where = f"line {number}" if number is not None else f"record {index + 1}"
            raise ValueError(f"{name}, {where}: not a history record (a JSON object), "
                             f"got {type(record).__name__}")
    if not records:
        raise ValueError(f"{name}: no history records")
    return records


def _records(history):
    """(records, name for messages) of what :func:`plot_history` accepts."""
    if isinstance(history, (str, os.PathLike)):
        return read_history(history), os.fspath(history)
    if hasattr(history, "history_"):                 # a fitted estimator
        history = history.history_
    elif hasattr(history, "fit"):
        raise ValueError(f"this {type(history).__name__} is not fitted yet (it has no "
                         "history_): call fit first")
    elif hasattr(history, "history") and not isinstance(history, dict):
        history = history.history                    # a SolverResult
    if isinstance(history, dict) or not hasattr(history, "__iter__"):
        raise TypeError("history must be a list of records (dicts), an estimator with "
                        f"history_, or the path of a history file, got "
                        f"{type(history).__name__}")
    records = list(history)
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            raise TypeError(f"history record {index + 1} is a {type(record).__name__}, "
                            "not a dict")
    if not records:
        raise ValueError("the history holds no records")
    return records, "history"


def _column(records, key, name):
    """The records' ``key`` as floats: NaN where a record lacks it or holds None; the
    strings "inf" and "-inf" (how the JSON writer keeps infinities) read as such."""
    out = np.full(len(records), np.nan)
    for index, record in enumerate(records):
        value = record.get(key)
        if value is None:
            continue
        try:
            out[index] = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{name}, record {index + 1}: {key} is not a number: "
                             f"{value!r}") from None
    return out


def _has(records, key):
    return any(record.get(key) is not None for record in records)


def _axes(ax, plt):
    """Three Axes: ``ax``'s, or those of a new figure."""
    if ax is None:
        _, axes = plt.subplots(1, 3, figsize=FIGSIZE, layout="constrained")
        return list(axes)
    axes = list(np.ravel(np.asarray(ax, dtype=object)))
    if len(axes) != 3:
        raise ValueError(f"ax must hold 3 Axes (gap vs time, gap vs epoch, features), "
                         f"got {len(axes)}")
    return axes


def _gap_panel(ax, x, gap, xlabel, ylabel):
    ax.plot(x, gap, marker="o", markersize=3, color="C0", label=ylabel)
    if np.any(np.isfinite(gap) & (gap > 0)):
        ax.set_yscale("log", nonpositive="mask")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="major", alpha=0.4)


def plot_history(history, ax=None, *, gap="rel_gap", title=None):
    """Draw a run: the duality gap against time and against epochs, and the features.

    Three panels: the duality gap against the wall time, the same gap against the
    outer iteration (both on a log scale, where a gap of 0 or less is not drawn), and
    the active features (those the screening left), the non-zero coefficients and,
    where a working-set step ran, the working set's size against the outer iteration
    (on a symmetric log scale once a count exceeds 100). Records that lack a value, or
    hold None, leave a gap in their line.

    Parameters
    ----------
    history : list of dict, estimator, or path
        The history records (:doc:`guide/history`): a list of dicts, a fitted estimator
        (its ``history_``), a ``SolverResult`` (its ``history``), or the path of a file
        written by the command lines' ``--history`` (JSON lines) or ``--history-json``.
    ax : sequence of 3 matplotlib Axes, optional
        Where to draw the three panels, in order; by default a new figure of three
        panels side by side, made with ``matplotlib.pyplot``.
    gap : {"rel_gap", "gap"}, default "rel_gap"
        The gap to draw: relative to P(0), or absolute. ``"rel_gap"`` draws the absolute
        gap where no record holds a relative one.
    title : str, optional
        The figure's title.

    Returns
    -------
    matplotlib.figure.Figure
        The figure of the panels (that of ``ax[0]`` where ``ax`` is given).

    Raises
    ------
    ImportError
        matplotlib is not installed (``pip install matplotlib``).
    ValueError
        No record, no record with a ``gap``, a value that is not a number, or ``ax``
        not of 3 Axes.
    OSError
        The history file cannot be read.

    See Also
    --------
    read_history : The records of a history file.

    Examples
    --------
    >>> from asyncopt import Lasso, plot_history
    >>> from asyncopt.data import load_a9a
    >>> X, y = load_a9a()
    >>> model = Lasso(alpha=0.005).fit(X[:3000], y[:3000])
    >>> fig = plot_history(model, title="a9a, 3,000 rows")      # doctest: +SKIP
    >>> fig.savefig("run.png")                                   # doctest: +SKIP
    """
    if gap not in GAP_KEYS:
        raise ValueError(f"gap must be one of {GAP_KEYS}, got {gap!r}")
    records, name = _records(history)
    return draw_records(records, name, ax, gap, title)


def draw_records(records, name, ax=None, gap="rel_gap", title=None):
    """:func:`plot_history`'s figure of the list of dicts ``records``; ``name`` (the
    history file, or "history") begins the error messages."""
    if not any("gap" in record for record in records):
        raise ValueError(f"{name}: no record has a 'gap' field (not a history of asyncopt?)")
    if gap == "rel_gap" and not _has(records, "rel_gap"):
        gap = "gap"
    values = _column(records, gap, name)
    epoch = (_column(records, "epoch", name) if _has(records, "epoch")
             else np.arange(len(records), dtype=float))
    time = _column(records, "time", name)

    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    axes = _axes(ax, plt)
    label = "relative duality gap" if gap == "rel_gap" else "duality gap"
    _gap_panel(axes[0], time, values, "wall time (s)", label)
    axes[0].set_title(f"{label} against time")
    _gap_panel(axes[1], epoch, values, "outer iteration", label)
    axes[1].set_title(f"{label} against epochs")

    counts = axes[2]
    largest = 0.0
    for key, legend, style in COUNTS:
        if not _has(records, key):
            continue
        column = _column(records, key, name)
        counts.plot(epoch, column, label=legend, **style)
        largest = max(largest, float(np.nanmax(column)))
    if largest > LINEAR_COUNTS:
        counts.set_yscale("symlog", linthresh=1.0)
    counts.set_ylim(bottom=0)
    counts.set_xlabel("outer iteration")
    counts.set_ylabel("features")
    counts.set_title("features against epochs")
    counts.grid(True, which="major", alpha=0.4)
    if counts.lines:
        counts.legend(loc="best", fontsize="small")
    for panel in axes[1:]:
        panel.xaxis.set_major_locator(MaxNLocator(integer=True))
    figure = axes[0].figure
    if title is not None:
        figure.suptitle(title)
    return figure
