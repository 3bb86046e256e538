"""``asyncopt-predict``: apply a model file of asyncopt-lasso / asyncopt-logreg
``--output`` to a LIBSVM file; write the predictions and print the metrics."""

from __future__ import annotations

import argparse
import sys

from asyncopt.cli.common import (EPILOG, OneLineArgumentParser, _HelpFormatter,
                                 check_writable, classes_text, format_summary, run_main)

PROG = "asyncopt-predict"
DESCRIPTION = (
    "Predict with a model file written by asyncopt-lasso / asyncopt-logreg --output on a "
    "LIBSVM file, and print the metrics on its labels: MSE and R^2 for a Lasso; accuracy, "
    "log-loss and ROC AUC for a logistic model."
)


def build_parser():
    """The command line of asyncopt-predict (errors: one line, see ``common``)."""
    p = OneLineArgumentParser(
        prog=PROG, description=DESCRIPTION, formatter_class=_HelpFormatter, epilog=EPILOG)
    p.add_argument("model", metavar="MODEL",
                   help="the model file (.npz) that asyncopt-lasso / asyncopt-logreg "
                        "--output wrote")
    p.add_argument("data", metavar="DATA",
                   help="LIBSVM file to predict on (plain, .gz, .bz2 or .xz); a file with "
                        "fewer features than the model reads the missing ones as 0")
    p.add_argument("--output", default=None, metavar="PRED",
                   help="write one prediction a line: X w + b for a Lasso, the probability "
                        "of the +1 class for a logistic model; '-' for stdout (the summary "
                        "then goes to stderr)")
    p.add_argument("--no-metrics", action="store_true",
                   help="the file's labels are placeholders (unlabeled data: any number, "
                        "e.g. 0, in the label's place): write the predictions, print no "
                        "metrics and do not check the labels against the model's classes")
    p.add_argument("--quiet", action="store_true", help="print no summary")
    return p


def write_predictions(path, values):
    """Write ``values`` one a line, each as the shortest text that reads back to the same
    double (Python's ``repr``), to ``path`` ('-': stdout)."""
    text = "".join(f"{v!r}\n" for v in values.tolist())
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    with open(path, "w", encoding="ascii") as f:
        f.write(text)


def predict(args: argparse.Namespace) -> int:
    """Read the model, then the data (both checked before anything is written), write
    the predictions and print the summary."""
    import numpy as np

    from asyncopt.cli.model import (decision_values, load_eval_data, load_model,
                                    metric_rows, predictions)

    if args.output != "-":
        check_writable(args.output)
    model = load_model(args.model)
    data = load_eval_data(args.data, model.loss, model.n_features,
                          None if args.no_metrics else model.classes)
    decision = decision_values(data.X, model.coef, model.intercept)
    if args.output is not None:
        write_predictions(args.output, predictions(model.loss, decision))
    if args.quiet:
        return 0
    kind = "Lasso" if model.loss == "squared" else "L1 logistic regression"
    rows = [("model", f"{args.model}: {kind}, alpha {model.alpha:.4e}, non-zero coef "
                      f"{int(np.count_nonzero(model.coef)):,} / {model.n_features:,}")]
    if model.classes is not None:
        rows.append(("classes", classes_text(model.classes)))
    rows.append(("data", data.description))
    if not args.no_metrics:
        rows += metric_rows(model.loss, data.y, decision)
    if args.output is not None:
        rows.append(("predictions", "stdout" if args.output == "-" else args.output))
    stream = sys.stderr if args.output == "-" else sys.stdout
    stream.write(format_summary(rows, f"{PROG} summary") + "\n")
    stream.flush()
    return 0


def _body(argv):
    return predict(build_parser().parse_args(argv))


def main(argv=None) -> int:
    return run_main(PROG, _body, argv)


if __name__ == "__main__":
    sys.exit(main())
