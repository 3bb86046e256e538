"""Checkpoints of a running solve: the full coefficient vector, the intercept, lam and the
history so far, written atomically (temporary file + rename) to a .npz file, so that a
stopped or killed run resumes from its last checkpoint instead of from zero."""
import json
import os
import zipfile

import numpy as np


def save_checkpoint(path, *, coef, intercept, lam, history):
    """Write the checkpoint to ``path`` atomically."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        np.savez(f, coef=np.asarray(coef, dtype=np.float64), intercept=float(intercept),
                 lam=float(lam), history=json.dumps(history))
    os.replace(tmp, path)


def load_checkpoint(path, n_features, lam=None):
    """(coef, intercept, lam, history) from ``path``; ValueError if it is not a checkpoint
    of a problem with ``n_features`` features, or (given ``lam``) of a run at another lam:
    resuming that run would carry its history, at another objective, into this one."""
    try:
        with np.load(path) as f:
            coef, intercept = f["coef"], float(f["intercept"])
            saved_lam, history = float(f["lam"]), json.loads(str(f["history"]))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{path}: not a readable asyncopt checkpoint ({exc})") from None
    if coef.shape != (n_features,):
        raise ValueError(f"{path}: checkpoint has {coef.shape[0]} coefficients but the "
                         f"problem has {n_features} features")
    if lam is not None and not np.isclose(saved_lam, lam, rtol=1e-9, atol=0.0):
        raise ValueError(f"{path}: checkpoint of a run at alpha = {saved_lam:.6g}, not "
                         f"{lam:.6g}: remove it or give this run another checkpoint path")
    return coef, intercept, saved_lam, history
