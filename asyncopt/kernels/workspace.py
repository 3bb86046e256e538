"""The epoch kernels' arguments, grouped: what the rows are, how features form blocks,
the step an epoch takes, and the threads' step clock.

Every epoch kernel (``kernels.svrg``, ``kernels.native``) takes
``(rows, blocks, step, x, intercept, samples)``, the SVRG ones a ``Clock`` after them;
x and intercept (a length-1 array) are updated in place. The groups are named tuples,
which numba passes into nopython code as typed tuples (its on-disk cache keys them by
class and field types); the constructors fix the scalars' Python types, so that one
compiled specialization serves every caller.
"""
from collections import namedtuple

import numpy as np

from ..losses import kernel_weights

__all__ = ["Rows", "Blocks", "SvrgStep", "SagaStep", "Clock"]


class Rows(namedtuple("Rows", "indptr indices data y code sample_weight")):
    """The rows a kernel samples: a_i = the CSR row i (indptr int64, indices int32,
    data float64), its label y[i], the loss code (``losses.SQUARED`` or
    ``losses.LOGISTIC``) and the rows' weights c_i in the kernel form
    (``losses.row_weight``: float64, empty for every c_i = 1, the default), which
    multiply the row's gradient: the kernels step on the loss c_i f(a_i^T x + b, y_i)."""

    __slots__ = ()

    def __new__(cls, indptr, indices, data, y, code, sample_weight=None):
        return super().__new__(cls, indptr, indices, data, y, int(code),
                               kernel_weights(sample_weight))


class Blocks(namedtuple("Blocks", "indptr feature_block positive l2")):
    """Contiguous blocks of the features: block g holds features indptr[g]:indptr[g+1],
    feature_block[j] is the block of feature j (singletons for L1, whose kernels do not
    read them); ``positive``: the penalty's (``penalties.L1``), x >= 0, which the L1
    kernels' prox keeps (``penalties.prox_l1``); ``l2``: the penalty's L2 strength over
    lam (the elastic net, ``penalties.L1``), which the L1 kernels' prox applies
    (``penalties.prox_elastic_net``: the shrink 1 / (1 + threshold l2)); the group
    kernels have neither."""

    __slots__ = ()

    def __new__(cls, indptr, feature_block, positive=False, l2=0.0):
        return super().__new__(cls, indptr, feature_block, bool(positive), float(l2))


class SvrgStep(namedtuple("SvrgStep", "z_snap weighted_mu mu_intercept thresholds eta "
                                      "eta_intercept variance_reduced")):
    """One prox-SVRG epoch's step (thesis eq. 3-6, 3-8): the anchor's margins
    z_snap[i] = a_i^T x~ + b~, its weighted gradient weighted_mu[j] = d_g mu_j (mu_j for
    the dense ProxASVRG kernel) and intercept component mu_intercept; the step eta and
    the intercept's eta_intercept = eta s^2; thresholds[g] = eta lam d_g w_g per block,
    +inf where frozen at zero for the epoch; variance_reduced False: DDSS-Naive's plain
    stochastic gradient f'(z) a_i."""

    __slots__ = ()

    def __new__(cls, z_snap, weighted_mu, mu_intercept, thresholds, eta, eta_intercept,
                variance_reduced=True):
        return super().__new__(cls, z_snap, weighted_mu, float(mu_intercept), thresholds,
                               float(eta), float(eta_intercept), bool(variance_reduced))


class SagaStep(namedtuple("SagaStep", "memory average average_intercept reweight "
                                      "thresholds eta eta_intercept")):
    """One proximal SAGA epoch's state and step (ProxASAGA): memory[i] the last f'(z_i)
    of row i, average = (1/n) A^T memory and average_intercept (length-1 array) its
    intercept component, both updated by the kernels; reweight[j] = d_g of feature j's
    block; thresholds, eta, eta_intercept as in SvrgStep."""

    __slots__ = ()

    def __new__(cls, memory, average, average_intercept, reweight, thresholds, eta,
                eta_intercept):
        return super().__new__(cls, memory, average, average_intercept, reweight,
                               thresholds, float(eta), float(eta_intercept))


class Clock(namedtuple("Clock", "steps staleness")):
    """The threads' shared step clock ``steps`` (int64[1]) and one thread's
    ``staleness`` = [sum tau, max tau] (int64[2]), both counted by the tracked SVRG
    kernels (``kernels.svrg.tick``); the serial kernels leave them alone."""

    __slots__ = ()

    @classmethod
    def fresh(cls, start=0):
        """A clock at ``start`` and zero staleness."""
        return cls(np.array([start], dtype=np.int64), np.zeros(2, dtype=np.int64))
