"""Checkpoints of a running solve: the full coefficient vector, the intercept, lam, the
elastic net's L2 strength over lam (0 for the L1 and group penalties) and the history so
far, written atomically (temporary file + rename) to a .npz file, so that a stopped or
killed run resumes from its last checkpoint instead of from zero."""
import json
import os
import zipfile

import numpy as np


def save_checkpoint(path, *, coef, intercept, lam, history, l2=0.0):
    """Write the checkpoint to ``path`` atomically (``l2``: the penalty's,
    ``penalties.L1``)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        np.savez(f, coef=np.asarray(coef, dtype=np.float64), intercept=float(intercept),
                 lam=float(lam), l2=float(l2), history=json.dumps(history))
    os.replace(tmp, path)


def load_checkpoint(path, n_features, lam=None, l2=0.0):
    """(coef, intercept, lam, history) from ``path``; ValueError if it is not a checkpoint
    of a problem with ``n_features`` features, or (given ``lam``) of a run at another lam
    or another L2 strength ``l2`` (the elastic net's l1_ratio = 1 / (1 + l2); a
    checkpoint without one is at l2 = 0): resuming that run would carry its history, at
    another objective, into this one."""
    try:
        with np.load(path) as f:
            coef, intercept = f["coef"], float(f["intercept"])
            saved_lam, history = float(f["lam"]), json.loads(str(f["history"]))
            saved_l2 = float(f["l2"]) if "l2" in f.files else 0.0
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{path}: not a readable asyncopt checkpoint ({exc})") from None
    if coef.shape != (n_features,):
        raise ValueError(f"{path}: checkpoint has {coef.shape[0]} coefficients but the "
                         f"problem has {n_features} features")
    if lam is not None and not np.isclose(saved_l2, l2, rtol=1e-9, atol=0.0):
        ratios = (1.0 / (1.0 + saved_l2), 1.0 / (1.0 + l2))
        raise ValueError(f"{path}: checkpoint of a run at l1_ratio = {ratios[0]:.6g}, not "
                         f"{ratios[1]:.6g}: remove it or give this run another checkpoint "
                         "path")
    if lam is not None and not np.isclose(saved_lam, lam, rtol=1e-9, atol=0.0):
        name = "alpha" if l2 == 0.0 else "alpha * l1_ratio"
        raise ValueError(f"{path}: checkpoint of a run at {name} = {saved_lam:.6g}, not "
                         f"{lam:.6g}: remove it or give this run another checkpoint path")
    return coef, intercept, saved_lam, history
