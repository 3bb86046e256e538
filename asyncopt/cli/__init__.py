"""Command-line front ends: ``asyncopt-lasso`` and ``asyncopt-logreg`` (training), and
``asyncopt-predict`` (a model file of theirs applied to other data; model.py).

Each module exposes ``main(argv=None) -> int``; the console scripts installed
by setup.py call it, and tests call it in-process with an argv list.
"""
