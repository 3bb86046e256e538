"""Shared code of the command lines: asyncopt-lasso, asyncopt-logreg, asyncopt-predict.

Error policy: a user's mistake (missing file, malformed LIBSVM line, bad
argument value, non-binary labels, ...) prints exactly ONE line

    <prog>: error: <message>

to stderr and exits with status 2 (command-line usage errors) or 1 (data and
value errors), never a traceback.  Ctrl-C exits with status 130 and one line.
Anything else is a bug and is allowed to show its traceback.  Set the
environment variable ``ASYNCOPT_DEBUG=1`` to get the traceback of a caught
ValueError / OSError as well (to tell a library bug from a user error).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import gc
import json
import math
import os
import signal
import sys
import threading
import time

from asyncopt.solvers.methods import BACKENDS, METHODS
from asyncopt.solvers.threads import effective_n_jobs

__all__ = [
    "CliUsageError",
    "OneLineArgumentParser",
    "build_parser",
    "run_main",
    "fit_and_report",
]

EXIT_OK = 0
EXIT_DATA_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class CliUsageError(Exception):
    """Command-line usage error (exit status 2)."""


class OneLineArgumentParser(argparse.ArgumentParser):
    """The command lines' ArgumentParser: errors are a single line and do not exit,
    and the data file may be given as the positional DATA or as ``--data PATH``
    (``parse_args`` puts it in ``data``).

    ``error`` raises :class:`CliUsageError`; :func:`run_main` prints it as
    ``prog: error: message`` and returns 2.  ``--help`` still exits 0.
    """

    def error(self, message):  # noqa: D401 - argparse API
        raise CliUsageError(message)

    def parse_args(self, args=None, namespace=None):
        """argparse's, with the data file given either as the positional DATA or as
        ``--data PATH`` (both: an error unless they name the same file) in ``data``."""
        parsed = super().parse_args(args, namespace)
        positional = vars(parsed).pop("data_positional", None)
        if positional is not None:
            if parsed.data is not None and parsed.data != positional:
                self.error(f"two data files: {positional!r} and --data {parsed.data!r}")
            parsed.data = positional
        return parsed


# -- argument types -----------------------------------------------------------

def _positive_float(text):
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}")
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return v


def _int_at_least(minimum):
    """argparse type: an integer >= minimum."""
    def parse(text):
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}")
        if v < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}")
        return v
    return parse


def _l1_ratio(text):
    """argparse type: the elastic-net mixing, a number in (0, 1]."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}")
    if not 0.0 < v <= 1.0:
        ridge = " (0 is ridge regression: nothing sparse to screen)" if v == 0.0 else ""
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text!r}{ridge}")
    return v


_positive_int = _int_at_least(1)
_nonneg_int = _int_at_least(0)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Show defaults, except the uninformative ones (None / False)."""

    def _get_help_string(self, action):
        if action.default in (None, False) or action.default is argparse.SUPPRESS:
            return action.help
        return super()._get_help_string(action)


EPILOG = ("Errors in the input print one line and exit with status 1 "
          "(2 for command-line mistakes). Set ASYNCOPT_DEBUG=1 for tracebacks.")


def build_parser(prog, description, default_alpha_ratio=1e-2):
    p = OneLineArgumentParser(
        prog=prog,
        description=description,
        formatter_class=_HelpFormatter,
        epilog=EPILOG,
    )
    p.add_argument(
        "data_positional", nargs="?", default=None, metavar="DATA",
        help="LIBSVM file to read (plain, .gz, .bz2 or .xz); default: the embedded a9a "
             "(Adult) data set",
    )
    p.add_argument("--data", default=None, metavar="PATH",
                   help="the LIBSVM file, as a flag (the same as DATA)")
    reg = p.add_mutually_exclusive_group()
    reg.add_argument("--alpha", type=_positive_float, default=None,
                     help="regularization strength alpha (> 0)")
    reg.add_argument("--alpha-ratio", type=_positive_float, default=default_alpha_ratio,
                     metavar="R", help="alpha = R * lam_max, the smallest alpha giving an all-zero model")
    p.add_argument("--tol", type=_positive_float, default=1e-6,
                   help="relative duality-gap tolerance: stop when gap <= tol * P(0)")
    p.add_argument("--max-epochs", type=_positive_int, default=100, metavar="N",
                   help="maximum number of outer iterations")
    p.add_argument("--method", choices=sorted(METHODS), default="auto",
                   help="auto (per outer iteration the faster of ddss's epoch and the "
                        "working set, under mpirun too), ddss (prox-SVRG + screening), "
                        "working_set (coordinate descent or proximal Newton on a working "
                        "set), ddss_naive (prox-SGD), or the baselines prox_asaga / "
                        "prox_asvrg / pse_safe / pse_strong")
    p.add_argument("--backend", choices=list(BACKENDS), default=None,
                   help="serial, threads (Sha-DDSS: lock-free threads sharing x) or mpi "
                        "(Dis-DDSS). Default: mpi when started by mpirun with 2 or more "
                        "ranks, else threads")
    p.add_argument("--n-jobs", type=_positive_int, default=None, metavar="T",
                   help="threads of the threads backend (default: all cores)")
    p.add_argument("--batch", type=_positive_int, default=None, metavar="B",
                   help="under mpirun: local steps a worker takes between two messages "
                        "(default n / (m workers): m = 2.5 workers messages per worker per "
                        "epoch up to 4 workers, else 10, or 25 when the node has fewer "
                        "cores than ranks)")
    p.add_argument("--no-screening", action="store_true",
                   help="disable gap-safe screening")
    p.add_argument("--no-intercept", action="store_true",
                   help="do not fit an (unpenalized) intercept")
    p.add_argument("--positive", action="store_true",
                   help="constrain the coefficients to be >= 0 (the intercept stays free), "
                        "as scikit-learn's positive=True; lam_max is then the one-sided "
                        "max_j x_j^T r / n")
    p.add_argument("--sample-weight", default=None, metavar="FILE",
                   help="weights of the rows: a text file of one number >= 0 per line, "
                        "line k the weight of row k of the data (as many lines as rows); "
                        "rescaled to sum to the number of rows, as scikit-learn's "
                        "sample_weight. A zero weight drops its row; a bad line is an "
                        "error naming FILE:LINE")
    p.add_argument("--l1-ratio", type=_l1_ratio, default=1.0, metavar="R",
                   help="elastic-net mixing in (0, 1], scikit-learn's l1_ratio: the "
                        "penalty is alpha (R ||w||_1 + (1 - R)/2 ||w||^2), alpha_max = "
                        "lam_max / R; 1 is the L1 model. R < 1 runs with the methods "
                        "auto, ddss, ddss_naive and working_set")
    p.add_argument("--degree", type=int, choices=[1, 2, 3], default=1,
                   help="feature-cross degree of the embedded a9a data set")
    p.add_argument("--seed", type=_nonneg_int, default=0, metavar="S",
                   help="random seed")
    p.add_argument("--quiet", action="store_true",
                   help="no live progress line (the summary is still printed)")
    p.add_argument("--history-json", default=None, metavar="PATH",
                   help="write the per-iteration history (list of records) as JSON")
    p.add_argument("--checkpoint", default=None, metavar="PATH",
                   help="write the solution so far to PATH (.npz; an existing directory, "
                        "or a PATH ending in /, gets PATH/checkpoint.npz) every minute "
                        "(under mpirun: every outer iteration) and at the end; if it "
                        "exists, resume from it")
    p.add_argument("--resume", action="store_true",
                   help="require resuming: fail unless the --checkpoint file exists")
    p.add_argument("--output", default=None, metavar="PATH",
                   help="write the model file that asyncopt-predict reads (.npz: coef, "
                        "intercept, alpha, loss, n_features, a logistic model's classes)")
    p.add_argument("--test", default=None, metavar="FILE",
                   help="a held-out LIBSVM file: read before the solve, and the fitted "
                        "model's metrics on it added to the summary (asyncopt-predict's)")
    p.add_argument("--history", default=None, metavar="PATH",
                   help="write the history as JSON lines, one record per outer iteration")
    p.add_argument("--save-coef", default=None, metavar="PATH",
                   help="save coefficients: .npy (coef only), .txt/.csv (text), "
                        "else .npz with coef, intercept, alpha")
    return p


# -- error handling -----------------------------------------------------------

def _one_line(text) -> str:
    return " ".join(str(text).split())


def _os_error_message(exc: OSError) -> str:
    if getattr(exc, "filename", None) is not None and getattr(exc, "strerror", None):
        return f"{exc.strerror}: {exc.filename}"
    return str(exc) or type(exc).__name__


def mpi_world():
    """(rank, size) when this process was started by mpirun / mpiexec with 2 or more ranks
    (MPICH's PMI_SIZE or Open MPI's OMPI_COMM_WORLD_SIZE), else None. mpi4py is imported
    (and MPI initialized) only then."""
    size = os.environ.get("PMI_SIZE") or os.environ.get("OMPI_COMM_WORLD_SIZE")
    if size is None or int(size) < 2:
        return None
    from asyncopt.comm import mpi_module

    MPI = mpi_module()
    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def freeze_at_exit():
    """At exit, freeze the objects then alive (``gc.freeze``) before the interpreter's
    last collection, which otherwise walks all that numba built (its typing and target
    contexts, each kernel's types) to free memory the process returns to the system
    anyway. Registered once however often called."""
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)


INTERRUPT_GRACE_S = 10.0


def _end_on_interrupt(prog, leader, grace=INTERRUPT_GRACE_S):
    """Under mpirun, make SIGINT (mpirun forwards one Ctrl-C to every rank) end this rank
    for certain: the handler raises KeyboardInterrupt as Python's does, and also arms a
    timer that, ``grace`` seconds later, ends the process with status 130
    (the leader printing the one "interrupted" line if it has not). Python drops an
    exception raised inside a finalizer ("Exception ignored in ... __del__"), which is
    where a Ctrl-C lands while numba compiles; that rank would run on and the others
    wait for it, and MPI_Finalize for them. Returns a function that marks the line
    printed."""
    printed = threading.Event()

    def force_exit():
        if leader and not printed.is_set():
            sys.stderr.write(f"{prog}: interrupted\n")
            sys.stderr.flush()
        os._exit(EXIT_INTERRUPTED)

    def on_sigint(signum, frame):
        timer = threading.Timer(grace, force_exit)
        timer.daemon = True
        timer.start()
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, on_sigint)
    return printed.set


def run_main(prog, body, argv=None) -> int:
    """Run ``body(argv)`` with the CLI error policy; return the exit status. Under mpirun
    only rank 0 prints the error line (every rank reads the same input and fails alike,
    and exits with the same status), and Ctrl-C ends every rank (``_end_on_interrupt``)."""
    freeze_at_exit()
    world = mpi_world()
    mark_printed = _end_on_interrupt(prog, world[0] == 0) if world is not None else None

    def fail(message, status):
        if world is not None and world[0] != 0:
            return status
        try:
            sys.stdout.flush()
        except Exception:  # pragma: no cover
            pass
        sys.stderr.write(f"{prog}: error: {_one_line(message)}\n")
        sys.stderr.flush()
        return status

    debug = os.environ.get("ASYNCOPT_DEBUG", "") not in ("", "0")
    try:
        status = body(argv)
        return EXIT_OK if status is None else int(status)
    except CliUsageError as exc:
        return fail(exc, EXIT_USAGE)
    except KeyboardInterrupt:
        if world is not None and world[0] != 0:    # mpirun sends Ctrl-C to every rank
            return EXIT_INTERRUPTED
        try:
            tty = sys.stderr.isatty()
        except (AttributeError, ValueError):
            tty = False
        # on a terminal, end a live progress line first
        sys.stderr.write(("\n" if tty else "") + f"{prog}: interrupted\n")
        sys.stderr.flush()
        if mark_printed is not None:
            mark_printed()
        return EXIT_INTERRUPTED
    except OSError as exc:  # FileNotFoundError, IsADirectoryError, PermissionError, ...
        if debug:
            raise
        return fail(_os_error_message(exc), EXIT_DATA_ERROR)
    except ValueError as exc:  # LibsvmFormatError, bad labels, bad values
        if debug:
            raise
        return fail(str(exc) or type(exc).__name__, EXIT_DATA_ERROR)


# -- data ---------------------------------------------------------------------

def read_libsvm(path, n_threads=None):
    """``(X, y)`` of the LIBSVM file ``path`` (``load_libsvm``, parsed on ``n_threads``
    threads: every core unless given); a missing path or a folder is the OSError that
    opening it raises, which run_main prints as ``reason: path``."""
    from asyncopt.data import load_libsvm

    if os.path.isdir(path):
        raise IsADirectoryError(21, "Is a directory", path)
    if not os.path.exists(path):
        raise FileNotFoundError(2, "No such file or directory", path)
    return load_libsvm(path, n_threads=n_threads)


def load_data(args, n_threads=None):
    """Return ``(X, y, description)`` for the parsed arguments (a LIBSVM file parsed on
    ``n_threads`` threads: ``load_libsvm``'s default, every core, unless given)."""
    from asyncopt.data import load_a9a

    if args.data is None:
        X, y = load_a9a(degree=args.degree)
        name = "a9a (embedded)" if args.degree == 1 else f"a9a (embedded, degree {args.degree})"
    else:
        if args.degree != 1:
            raise CliUsageError("--degree applies to the embedded a9a data set only")
        X, y = read_libsvm(args.data, n_threads)
        name = args.data
    n, p = X.shape
    if n < 2:
        raise ValueError(f"{name}: need at least 2 samples, got {n}")
    if p < 1:
        raise ValueError(f"{name}: no features")
    return X, y, name


def read_sample_weight(path, n_rows, data_name):
    """The --sample-weight FILE for ``n_rows`` rows of ``data_name``: one number >= 0 per
    line, line k the weight of row k, rescaled to sum to n_rows
    (``problem.rescaled_sample_weight``: None where the weights are all equal). A fault
    is a ValueError of one line naming the file and the line ("FILE:LINE: ..."): a line
    that is not one number (blank lines too), NaN or infinity, a negative weight, a count
    of lines other than n_rows, or weights that are all zero; a missing file or a folder
    is the OSError opening it raises."""
    import numpy as np

    from asyncopt.problem import rescaled_sample_weight

    if os.path.isdir(path):
        raise IsADirectoryError(21, "Is a directory", path)
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise ValueError(f"{path}:{line}: not text (expected one number per line)") \
            from None
    lines = text.split("\n")
    if lines[-1] == "":                   # the last line's newline
        lines.pop()
    values = np.empty(len(lines))
    for k, line in enumerate(lines):
        try:
            values[k] = float(line)
        except ValueError:
            shown = line.strip()
            shown = shown if len(shown) <= 40 else shown[:40] + "..."
            raise ValueError(f"{path}:{k + 1}: bad weight {shown!r} (expected one number "
                             ">= 0 per line)") from None
        if not math.isfinite(values[k]):
            raise ValueError(f"{path}:{k + 1}: weight {line.strip()} is not finite")
        if values[k] < 0:
            raise ValueError(f"{path}:{k + 1}: negative weight {line.strip()} (weights "
                             "must be >= 0)")
    if len(lines) != n_rows:
        raise ValueError(f"{path}: {len(lines)} weights for the {n_rows} rows of "
                         f"{data_name} (one line per row)")
    if not np.any(values > 0):
        raise ValueError(f"{path}: every weight is zero: nothing to fit")
    return rescaled_sample_weight(values, n_rows)


def binary_labels(y, name):
    """Map binary labels to {-1, +1}; returns (y_pm, classes)."""
    from asyncopt.problem import encode_binary_labels

    try:
        return encode_binary_labels(y)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None


def classes_text(classes):
    """The summary's "classes" row: which label is coded -1 and which +1."""
    return f"{classes[0]:g} -> -1, {classes[1]:g} -> +1"


def held_out(args, loss, p, classes, n_threads=None):
    """--test's data (``model.load_eval_data``) for a model of ``p`` features with the
    training labels' ``classes``; None without --test."""
    if args.test is None:
        return None
    from asyncopt.cli.model import load_eval_data

    return load_eval_data(args.test, loss, p, classes, n_threads)


# -- output -------------------------------------------------------------------

def _jsonable(obj):
    import numpy as np

    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    return obj


def write_history(path, history):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(_jsonable(list(history or [])), f, indent=1)
        f.write("\n")


def checkpoint_file(path):
    """The file a --checkpoint PATH names: PATH, or checkpoint.npz in it where PATH is a
    folder (one that exists, or one ending in a separator); None for None."""
    if path is not None and (path.endswith(os.sep) or os.path.isdir(path)):
        return os.path.join(path, "checkpoint.npz")
    return path


def checkpoint_path(args):
    """--checkpoint as a file path (``checkpoint_file``); checks --resume."""
    path = checkpoint_file(args.checkpoint)
    if args.resume and (path is None or not os.path.exists(path)):
        raise CliUsageError("--resume needs an existing --checkpoint file" +
                            ("" if path is None else f" ({path} not found)"))
    return path


def check_output_paths(args):
    """Fail before the solve, not after it, where a file the run writes at its end or on
    the way cannot be made: the folders of --output, --save-coef, --history,
    --history-json and --checkpoint's file (``checkpoint_file``) must exist, and the
    files must not be folders (OSError naming the path, as writing it would raise)."""
    check_writable(args.output, getattr(args, "save_coef", None),
                   getattr(args, "history", None), getattr(args, "history_json", None),
                   checkpoint_file(args.checkpoint))


def check_writable(*paths):
    """OSError naming the first of ``paths`` (None: skipped) whose folder does not exist
    or that is a folder, as writing it would raise."""
    import errno

    for path in paths:
        if path is None:
            continue
        folder = os.path.abspath(os.path.dirname(path) or os.curdir)
        if not os.path.exists(folder):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        if not os.path.isdir(folder):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
        if os.path.isdir(path):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)


def write_history_lines(path, history):
    with open(path, "w", encoding="utf-8") as f:
        for record in history or []:
            f.write(json.dumps(_jsonable(record)) + "\n")


def save_coef(path, est, alpha):
    import numpy as np

    coef = np.asarray(est.coef_).ravel()
    intercept = float(np.ravel(est.intercept_)[0])
    low = path.lower()
    if low.endswith(".npy"):
        with open(path, "wb") as f:
            np.save(f, coef)
    elif low.endswith((".txt", ".csv")):
        np.savetxt(path, coef, delimiter=",")
    else:
        with open(path, "wb") as f:
            np.savez(f, coef=coef, intercept=intercept, alpha=alpha)


def format_summary(rows, title):
    width = max(len(k) for k, _ in rows)
    lines = [title, "-" * len(title)]
    lines += [f"  {k:<{width}}  {v}" for k, v in rows]
    return "\n".join(lines)


# -- the whole run ------------------------------------------------------------

def fit_and_report(args, prog, loss, title):
    """Load the data, fit, write the outputs; print the summary to stdout. Without mpirun
    the process solves with ``solve_method`` (the estimators' solver) on the threads or
    serial backend; under mpirun the ranks run solve_mpi. Neither imports the estimators
    nor scikit-learn, whose start-up every rank would pay."""
    import numpy as np

    from asyncopt.problem import Problem
    from asyncopt.solvers.methods import solve_method
    from asyncopt.solvers.threads import ThreadsInnerLoop

    check_l1_ratio_method(args)
    world = mpi_world()
    if world is not None and args.backend in (None, "mpi"):
        return fit_and_report_mpi(args, prog, loss, title, world)
    backend = args.backend or "threads"
    if backend == "mpi":
        raise CliUsageError("--backend mpi needs mpirun: mpirun -n K " + prog + " ... "
                            "(K >= 2: 1 server + K-1 workers)")
    threads = effective_n_jobs(args.n_jobs)
    check_output_paths(args)
    X, y, name = load_data(args, threads)
    n, p = X.shape
    nnz = int(X.nnz) if hasattr(X, "nnz") else int(np.count_nonzero(X))
    fit_intercept = not args.no_intercept

    classes = None
    if loss == "logistic":
        y, classes = binary_labels(y, name)
    else:
        y = np.asarray(y, dtype=float)
        if not np.all(np.isfinite(y)):
            raise ValueError(f"{name}: targets contain NaN or infinity")
    test = held_out(args, loss, p, classes, threads)
    weights = None if args.sample_weight is None else \
        read_sample_weight(args.sample_weight, n, name)

    # X was read for this solve alone: its arrays serve as the first epoch view
    problem = Problem(X, y, loss, elastic_net_penalty(args, p), 1.0, fit_intercept,
                      overwrite_X=True, sample_weight=weights)
    # alpha in scikit-learn's elastic-net scale: the L1 part's lam = alpha l1_ratio
    lmax = float(problem.lam_max()) / args.l1_ratio
    alpha, ratio = alpha_from(args, lmax, name)
    leader = world is None or world[0] == 0
    if args.backend is None and world is None and not args.quiet:
        sys.stderr.write(f"{prog}: started without mpirun: running the threads backend "
                         f"({threads} threads)\n")
    t0 = time.perf_counter()
    checkpoint = checkpoint_path(args)
    with checkpoint_on_sigterm(checkpoint, "the solver's"):
        result = solve_method(
            problem.with_lam(alpha * args.l1_ratio), args.method, tol=args.tol,
            max_epochs=args.max_epochs,
            screening=not args.no_screening, random_state=args.seed,
            verbose=0 if args.quiet or not leader else 1, checkpoint=checkpoint,
            inner_loop=ThreadsInnerLoop(args.n_jobs) if backend == "threads" else None)
    wall = time.perf_counter() - t0
    if not leader:
        return EXIT_OK
    return report(args, title, _fitted(result), name, n, p, nnz, classes, alpha, ratio,
                  lmax, fit_intercept, backend, world, wall, loss=loss, test=test)


@contextlib.contextmanager
def checkpoint_on_sigterm(path, whose, holder=True):
    """While the solve runs, SIGTERM (a scheduler ending the job, mpirun forwarding a
    kill) prints one line and raises SystemExit(143): the solver's driver writes its
    current x, mid-epoch a valid iterate, to the checkpoint ``path`` as it unwinds
    (``ddss.Driver.run``). Nothing is installed without a path, or off the main thread.
    ``whose``: the process that holds x ("the server's" under mpirun). ``holder=False``
    (an MPI worker) ignores SIGTERM instead: a worker killed first would make mpirun
    kill the server before its handler has run (it runs only between bytecodes, so not
    while a kernel compiles), and the server's exit ends every worker anyway."""
    if path is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigterm(signum, frame):
        sys.stderr.write(f"asyncopt: terminated; the checkpoint {path} holds {whose} x "
                         "(--resume continues from it)\n")
        sys.stderr.flush()
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, on_sigterm if holder else signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _fitted(result):
    """A SolverResult under the estimators' fitted-attribute names, what ``report``
    reads."""
    from types import SimpleNamespace

    import numpy as np
    return SimpleNamespace(coef_=result.coef, intercept_=result.intercept,
                           history_=result.history, dual_gap_=result.gap,
                           objective_=result.primal,
                           active_set_=np.sort(result.active_features),
                           n_iter_=result.n_iter)


def check_l1_ratio_method(args):
    """CliUsageError (status 2, one line) for --l1-ratio < 1 with a baseline method,
    which has no elastic net (``solvers.methods.ELASTIC_NET_METHODS``)."""
    from asyncopt.solvers.methods import ELASTIC_NET_METHODS

    if args.l1_ratio < 1.0 and args.method not in ELASTIC_NET_METHODS:
        raise CliUsageError(f"--method {args.method} has no elastic net: --l1-ratio "
                            f"{args.l1_ratio:g} needs one of "
                            f"{', '.join(ELASTIC_NET_METHODS)}")


def elastic_net_penalty(args, p):
    """The L1 penalty of --positive and --l1-ratio (``penalties.L1``: l2 = (1 - R) / R
    relative to lam = alpha R)."""
    from asyncopt.penalties import L1, elastic_net_strengths

    _, l2 = elastic_net_strengths(1.0, args.l1_ratio)
    return L1(p, positive=args.positive, l2=l2)


def alpha_from(args, lmax, name):
    """(alpha, alpha / lam_max) from --alpha or --alpha-ratio (``lmax``: alpha_max,
    lam_max / l1_ratio with --l1-ratio)."""
    if args.alpha is not None:
        alpha = float(args.alpha)
        return alpha, (alpha / lmax if lmax > 0 else float("inf"))
    if not lmax > 0:
        why = ": no feature correlates positively with the target" if args.positive else ""
        raise ValueError(f"{name}: lam_max is 0 (the all-zero model is already optimal"
                         f"{why}); give --alpha explicitly")
    return float(args.alpha_ratio) * lmax, float(args.alpha_ratio)


def fit_and_report_mpi(args, prog, loss, title, world):
    """Dis-DDSS under mpirun: every worker reads only its shard (cli/distributed.py),
    rank 0 serves and prints the summary."""
    from mpi4py import MPI

    from asyncopt.solvers.methods import MPI_METHODS, solver_flags
    from asyncopt.losses import get_loss
    from asyncopt.penalties import L1
    from asyncopt.problem import Problem
    from asyncopt.solvers.mpi import distributed_lam_max, load_server_kernels, solve_mpi

    from asyncopt.comm.wire import ending_every_rank_on_error

    from .distributed import agree, labels, load_shard, shard_sample_weight

    comm = MPI.COMM_WORLD
    check_l1_ratio_method(args)
    if args.method not in MPI_METHODS:
        raise CliUsageError(f"--method {args.method} does not run under mpirun yet: use one "
                            f"of {', '.join(MPI_METHODS)}")
    agree(comm, lambda: check_output_paths(args) if world[0] == 0 else None)
    code = get_loss(loss).code
    # L1(1): the same kernels as the problem's L1(p), whose p the workers are reading
    X, y, name, n, p, nnz = load_shard(
        args, comm, server_meanwhile=lambda: load_server_kernels(L1(1), code))
    y, classes = labels(comm, y, loss, name)
    # --test: read by the server, which prints the summary, before the solve
    test = agree(comm, lambda: held_out(args, loss, p, classes) if world[0] == 0 else None)
    fit_intercept = not args.no_intercept
    penalty = elastic_net_penalty(args, p)
    weights = shard_sample_weight(comm, args.sample_weight, X, n, name)
    # the shard's rows are this rank's alone: their arrays serve as its first epoch view
    shard = None if X is None else Problem(X, y, loss, penalty, 1.0, fit_intercept,
                                           overwrite_X=True, sample_weight=weights)
    lmax = distributed_lam_max(comm, shard, penalty, n, code, fit_intercept) / \
        args.l1_ratio
    alpha, ratio = agree(comm, lambda: alpha_from(args, lmax, name))
    lam = alpha * args.l1_ratio      # the L1 part's (alpha itself at --l1-ratio 1)
    if shard is not None:
        shard = shard.with_lam(lam)
    leader = world[0] == 0
    t0 = time.perf_counter()
    checkpoint = checkpoint_path(args)
    # an OSError there is a file one rank writes (the server's checkpoint): one line
    with ending_every_rank_on_error(comm, prog, lambda exc: _os_error_message(exc)
                                    if isinstance(exc, OSError) else None), \
            checkpoint_on_sigterm(checkpoint, "the server's", holder=leader):
        result = solve_mpi(comm, shard, penalty, p, code, lam, fit_intercept,
                           tol=args.tol, max_epochs=args.max_epochs,
                           **solver_flags(args.method, not args.no_screening),
                           batch=args.batch, random_state=args.seed, checkpoint=checkpoint,
                           verbose=0 if args.quiet or not leader else 1, label=args.method)
    wall = time.perf_counter() - t0
    if not leader:
        return EXIT_OK
    return report(args, title, _fitted(result), name, n, p, nnz, classes, alpha, ratio,
                  lmax, fit_intercept, "mpi", world, wall, loss=loss, test=test)


def report(args, title, est, name, n, p, nnz, classes, alpha, ratio, lmax, fit_intercept,
           backend, world, wall, loss, test=None):
    """Write --history-json / --save-coef / --output (the model file of ``loss``) and
    print the summary table, with the metrics on ``test`` (``held_out``) if given."""
    import numpy as np

    from asyncopt.cli.model import decision_values, metric_rows, save_model

    spec = METHODS[args.method]
    method = args.method
    screens = "static" if "pse" in spec else \
        ("on" if not args.no_screening and spec["screening"] else "off")
    if backend == "threads":
        backend += f" ({effective_n_jobs(args.n_jobs)} threads)"
    elif backend == "mpi":
        backend += f" (1 server + {world[1] - 1} workers)"
    history = est.history_
    gap = float(est.dual_gap_)
    rel_gap = float(history[-1]["rel_gap"])
    objective = float(est.objective_)
    coef = np.asarray(est.coef_).ravel()
    n_kept = int(np.size(est.active_set_))
    n_iter = est.n_iter_
    intercept = float(np.ravel(est.intercept_)[0])
    converged = rel_gap <= args.tol

    rows = [
        ("data", f"{name}: {n:,} x {p:,}, nnz {nnz:,} ({nnz / max(1, n * p):.2%} dense)"),
    ]
    if classes is not None:
        rows.append(("classes", classes_text(classes)))
    rows += [
        ("method", f"{method}, {backend}, screening {screens}"
                   f"{', coef >= 0' if args.positive else ''}"
                   f"{f', l1_ratio {args.l1_ratio:g}' if args.l1_ratio < 1 else ''}"),
        ("alpha", f"{alpha:.4e}  (alpha/alpha_max = {ratio:.3g}, alpha_max = {lmax:.4e})"
         if args.l1_ratio < 1 else
         f"{alpha:.4e}  (alpha/lam_max = {ratio:.3g}, lam_max = {lmax:.4e})"),
        ("objective", f"{objective:.8e}"),
        ("duality gap", f"{gap:.3e}  (relative {rel_gap:.3e}, tol {args.tol:g}"
                        f"{'' if converged else ', NOT reached: raise --max-epochs'})"),
        ("kept by screening", f"{n_kept:,} / {p:,} features"),
        ("non-zero coef", f"{int(np.count_nonzero(coef)):,} / {p:,}"),
    ]
    if fit_intercept:
        rows.append(("intercept", f"{intercept:.6g}"))
    if getattr(args, "sample_weight", None) is not None:
        rows.append(("sample weights", args.sample_weight))
    rows += [
        ("outer iterations", f"{int(n_iter)}"),
        ("wall time", f"{wall:.2f} s"),
    ]
    if test is not None:
        rows.append(("test data", test.description))
        rows += [(f"test {key}", value) for key, value in
                 metric_rows(loss, test.y, decision_values(test.X, coef, intercept))]

    if args.history_json:
        write_history(args.history_json, history)
        rows.append(("history", args.history_json))
    if args.history:
        write_history_lines(args.history, history)
        rows.append(("history", args.history))
    if args.save_coef:
        save_coef(args.save_coef, est, alpha)
        rows.append(("coefficients", args.save_coef))
    if args.output:
        path = args.output if args.output.lower().endswith(".npz") else args.output + ".npz"
        save_model(path, coef, intercept, alpha, loss, classes)
        rows.append(("output", path))

    sys.stdout.write(format_summary(rows, title) + "\n")
    sys.stdout.flush()
    return EXIT_OK
