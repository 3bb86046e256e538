"""``asyncopt-lasso``: fit a Lasso with DDSS on a LIBSVM file (default: a9a)."""

from __future__ import annotations

import sys

from asyncopt.cli.common import build_parser, fit_and_report, run_main

PROG = "asyncopt-lasso"
DESCRIPTION = (
    "Fit a Lasso, (1/2n)||y - Xw - b||^2 + alpha ||w||_1, with DDSS "
    "(gap-safe screening + sparse proximal SVRG) and print a summary; with "
    "--l1-ratio R < 1 the elastic net, penalty alpha (R ||w||_1 + (1 - R)/2 ||w||^2)."
)


def _body(argv):
    args = build_parser(PROG, DESCRIPTION, default_alpha_ratio=1e-2).parse_args(argv)
    return fit_and_report(args, PROG, loss="squared", title=f"{PROG} summary")


def main(argv=None) -> int:
    return run_main(PROG, _body, argv)


if __name__ == "__main__":
    sys.exit(main())
