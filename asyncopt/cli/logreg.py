"""``asyncopt-logreg``: fit an L1 logistic regression with DDSS (default: a9a)."""

from __future__ import annotations

import sys

from asyncopt.cli.common import build_parser, fit_and_report, run_main

PROG = "asyncopt-logreg"
DESCRIPTION = (
    "Fit a sparse logistic regression, (1/n) sum log(1 + exp(-y_i (x_i^T w + b))) "
    "+ alpha ||w||_1, with DDSS (gap-safe screening + sparse proximal SVRG) and "
    "print a summary (with --l1-ratio R < 1 the elastic-net penalty alpha (R ||w||_1 + "
    "(1 - R)/2 ||w||^2)). Labels must take exactly two values (mapped to -1/+1)."
)


def _body(argv):
    args = build_parser(PROG, DESCRIPTION, default_alpha_ratio=1e-2).parse_args(argv)
    return fit_and_report(args, PROG, loss="logistic", title=f"{PROG} summary")


def main(argv=None) -> int:
    return run_main(PROG, _body, argv)


if __name__ == "__main__":
    sys.exit(main())
