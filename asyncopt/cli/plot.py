"""``asyncopt-plot``: draw a history file of ``--history`` (or ``--history-json``) as
``plot_history``'s figure, the duality gap against time and epochs and the features
left, into a PNG (or any file format matplotlib writes)."""

from __future__ import annotations

import argparse
import os
import sys

from asyncopt.cli.common import (EPILOG, OneLineArgumentParser, _HelpFormatter,
                                 _positive_int, check_writable, run_main)

PROG = "asyncopt-plot"
DESCRIPTION = (
    "Draw a run from its history file (the JSON lines of asyncopt-lasso / asyncopt-logreg "
    "--history, or the JSON list of --history-json): the duality gap against wall time "
    "and against outer iterations, on log scales, and the active features and non-zero "
    "coefficients against outer iterations."
)


def build_parser():
    """The command line of asyncopt-plot (errors: one line, see ``common``)."""
    p = OneLineArgumentParser(
        prog=PROG, description=DESCRIPTION, formatter_class=_HelpFormatter, epilog=EPILOG)
    p.add_argument("history", metavar="HISTORY",
                   help="the history file (.jsonl of --history, or .json of --history-json)")
    p.add_argument("-o", "--output", default=None, metavar="IMAGE",
                   help="the image to write; its extension picks the format (.png, .pdf, "
                        ".svg, ...). Default: HISTORY with the extension .png")
    p.add_argument("--title", default=None, metavar="T",
                   help="the figure's title (default: the history file's name)")
    p.add_argument("--absolute", action="store_true",
                   help="draw the absolute duality gap instead of the relative one")
    p.add_argument("--dpi", type=_positive_int, default=100,
                   help="dots per inch of a raster image (the figure is 13 x 3.8 inches)")
    return p


def default_output(history):
    """HISTORY with its extension replaced by .png (run.jsonl -> run.png)."""
    return os.path.splitext(history)[0] + ".png"


def draw(args: argparse.Namespace) -> int:
    """Read the history (checked before the image is written), draw it and save it."""
    output = args.output or default_output(args.history)
    check_writable(output)
    try:
        import matplotlib
    except ImportError:
        raise ValueError("asyncopt-plot needs matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")                  # a file is written, no window opened
    import matplotlib.pyplot as plt

    from asyncopt.plot import draw_records, read_history

    records = read_history(args.history)
    title = args.title if args.title is not None else os.path.basename(args.history)
    figure = draw_records(records, args.history, gap="gap" if args.absolute else "rel_gap",
                          title=title)
    try:
        figure.savefig(output, dpi=args.dpi)
    finally:
        plt.close(figure)
    sys.stdout.write(f"{PROG}: wrote {output} ({len(records)} records)\n")
    sys.stdout.flush()
    return 0


def main(argv=None) -> int:
    """Run asyncopt-plot on ``argv`` (default: the process's arguments); the exit status."""
    return run_main(PROG, lambda args: draw(build_parser().parse_args(args)), argv)


if __name__ == "__main__":
    sys.exit(main())
