/*
 * asyncopt native inner loop: the lock-free (Hogwild) sparse prox-SVRG epoch of Sha-DDSS
 * in plain C + OpenMP (no Python C API; loaded with ctypes by asyncopt/kernels/native.py).
 *
 * The two exported functions mirror the *tracked* numba kernels of asyncopt/kernels/svrg.py
 * (epoch_l1 / epoch_group of _make_epoch_kernels(True)) operation for operation, so that
 * with one thread the results are bit-identical to numba (build with -ffp-contract=off: no
 * FMA contraction, as numba without fastmath).
 *
 * Threads: slice s of `samples` is numpy.array_split(samples, n_threads)[s]; OpenMP thread
 * t of the team runs slices t, t + team, ... (normally exactly slice t). Every slice has
 * private staleness counters staleness[2 s] (sum tau), staleness[2 s + 1] (max tau) and a
 * private intercept b that it publishes every INTERCEPT_SYNC steps of the slice, as the
 * tracked numba kernels do: an atomic add of its accumulated delta to the shared
 * *intercept, then a re-read.
 *
 * Sample weights: `sample_weight` (NULL without weights) scales row i's gradient
 * difference by c_i, as numba's row_weight does (a NULL gives c_i = 1.0, a product that
 * is exact, so the unweighted epoch is bit for bit the one before weights).
 *
 * Shared x: every write is an atomic compare-and-swap on the 64-bit pattern of x_j
 * (GCC/Clang __atomic builtins); every read is a relaxed atomic load.
 *   L1:    CAS(x_j, old, prox_elastic_net(old - eta (diff a_ij + wmu_j), thr_j, positive,
 *          l2)) (on one thread this is exactly numba's x[j] = prox_elastic_net(x[j] - ...,
 *          thr, positive, l2); with positive the prox is max(u - thr, 0), so every value
 *          swapped in is >= 0; l2 > 0, the elastic net, divides by 1 + thr l2).
 *   group: the block's new value is formed in private buffers from one read of x_g, then
 *          x_j += new_j - old_j per coordinate with a CAS add (eq. 3-10).
 * Clock: shared int64 step counter; tau = (clock value fetched by my atomic increment)
 * - (clock value read at step start).
 *
 * Return value: 0 on success, 1 if a per-thread work buffer could not be allocated
 * (x may then be partly updated), 2 on invalid arguments.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(_WIN32)
#define ASYNCOPT_EXPORT __declspec(dllexport)
#else
#define ASYNCOPT_EXPORT __attribute__((visibility("default")))
#endif

/* ---- numba semantics of max/min: max(a, b) = b > a ? b : a ------------------------ */
static inline double nb_max(double a, double b) { return b > a ? b : a; }
static inline double nb_min(double a, double b) { return b < a ? b : a; }
static inline int64_t nb_max_i64(int64_t a, int64_t b) { return b > a ? b : a; }

/* ---- losses.py: loss_derivative (code 0 squared, 1 logistic) ----------------------- */
static inline double loss_derivative(int code, double z, double y)
{
    if (code == 0)
        return z - y;
    double t = y * z;
    if (t > 0.0) {
        double e = exp(-t);
        return -y * e / (1.0 + e);
    }
    return -y / (1.0 + exp(t));
}

/* c_i (f'(z) - f'(z~_i)) or c_i f'(z); c_i the row's sample weight, 1.0 where
 * sample_weight is NULL (svrg.py: gradient_difference with losses.row_weight). */
static inline double gradient_difference(int code, double z, double z_snap_i, double y_i,
                                         double c_i, int variance_reduced)
{
    if (variance_reduced)
        return c_i * (loss_derivative(code, z, y_i) - loss_derivative(code, z_snap_i, y_i));
    return c_i * loss_derivative(code, z, y_i);
}

static inline double row_weight(const double *sample_weight, int64_t i)
{
    return sample_weight ? sample_weight[i] : 1.0;
}

/* ---- penalties.py: prox_l1 ------------------------------------------------------------ */
static inline double prox_l1(double u, double threshold, int positive)
{
    double upper = nb_max(u - threshold, 0.0);
    return positive ? upper : upper + nb_min(u + threshold, 0.0);
}

/* ---- penalties.py: prox_elastic_net ---------------------------------------------------- */
static inline double prox_elastic_net(double u, double threshold, int positive, double l2)
{
    double v = prox_l1(u, threshold, positive);
    return l2 > 0.0 ? v / (1.0 + threshold * l2) : v;
}

/* ---- atomics on shared doubles --------------------------------------------------------- */
static inline double load_relaxed(const double *p)
{
    double v;
    __atomic_load(p, &v, __ATOMIC_RELAXED);
    return v;
}

/* x_j <- x_j + delta, atomically (CAS loop on the bit pattern). */
static inline void atomic_add(double *p, double delta)
{
    double old, new_;
    __atomic_load(p, &old, __ATOMIC_RELAXED);
    do {
        new_ = old + delta;
    } while (!__atomic_compare_exchange(p, &old, &new_, 0, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED));
}

/* x_j <- prox_elastic_net(x_j - step, thr, positive, l2) atomically, the prox applied to
 * the value swapped. */
static inline void atomic_prox_l1(double *p, double step, double thr, int positive,
                                  double l2)
{
    double old, new_;
    __atomic_load(p, &old, __ATOMIC_RELAXED);
    do {
        new_ = prox_elastic_net(old - step, thr, positive, l2);
    } while (!__atomic_compare_exchange(p, &old, &new_, 0, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED));
}

/* ---- svrg.py: step_intercept / finish_intercept (tracked) ------------------------------ */
#define INTERCEPT_SYNC 32

static inline void step_intercept(double *intercept, double *b, double *delta, double step,
                                  int64_t t)
{
    *b -= step;
    *delta -= step;
    if ((t + 1) % INTERCEPT_SYNC == 0) {
        atomic_add(intercept, *delta);
        *b = load_relaxed(intercept);
        *delta = 0.0;
    }
}

/* ---- svrg.py: row_margin ----------------------------------------------------------------- */
static inline double row_margin(const int64_t *indptr, const int32_t *indices,
                                const double *data, const double *x, double b, int64_t i)
{
    double acc = b;
    for (int64_t k = indptr[i]; k < indptr[i + 1]; k++)
        acc += data[k] * load_relaxed(&x[indices[k]]);
    return acc;
}

/* numpy.array_split(n, parts)[s] as [start, end). */
static inline void split_bounds(int64_t n, int64_t parts, int64_t s, int64_t *start,
                                int64_t *end)
{
    int64_t q = n / parts, r = n % parts;
    *start = s * q + (s < r ? s : r);
    *end = *start + q + (s < r ? 1 : 0);
}

static inline int64_t clock_read(const int64_t *clock)
{
    return __atomic_load_n(clock, __ATOMIC_RELAXED);
}

static inline int64_t clock_tick(int64_t *clock)
{
    return __atomic_fetch_add(clock, (int64_t)1, __ATOMIC_RELAXED);
}

/* ========================================================================================= */

ASYNCOPT_EXPORT int asyncopt_svrg_epoch_l1(
    const int64_t *indptr, const int32_t *indices, const double *data, const double *y,
    int code, const double *sample_weight, double *x, double *intercept,
    double eta_intercept, const double *z_snap, const double *weighted_mu, double mu_intercept, const double *thresholds, double eta,
    const int64_t *samples, int64_t n_samples, int variance_reduced, int n_threads,
    int64_t *clock, int64_t *staleness, int positive, double l2)
{
    if (n_threads < 1 || n_samples < 0)
        return 2;

#pragma omp parallel num_threads(n_threads)
    {
        int team = 1, tid = 0;
#ifdef _OPENMP
        team = omp_get_num_threads();
        tid = omp_get_thread_num();
#endif
        for (int s = tid; s < n_threads; s += team) {
            int64_t start, end;
            split_bounds(n_samples, n_threads, s, &start, &end);
            double b = load_relaxed(intercept), delta = 0.0;
            int64_t tau_sum = staleness[2 * s], tau_max = staleness[2 * s + 1];
            for (int64_t t = start; t < end; t++) {
                int64_t i = samples[t];
                int64_t seen = clock_read(clock);
                double z = row_margin(indptr, indices, data, x, b, i);
                double diff = gradient_difference(code, z, z_snap[i], y[i],
                                                  row_weight(sample_weight, i),
                                                  variance_reduced);
                for (int64_t k = indptr[i]; k < indptr[i + 1]; k++) {
                    int64_t j = indices[k];
                    atomic_prox_l1(&x[j], eta * (diff * data[k] + weighted_mu[j]),
                                   thresholds[j], positive, l2);
                }
                step_intercept(intercept, &b, &delta, eta_intercept * (diff + mu_intercept),
                               t - start);
                int64_t now = clock_tick(clock);
                tau_sum += now - seen;
                tau_max = nb_max_i64(tau_max, now - seen);
            }
            atomic_add(intercept, delta);
            staleness[2 * s] = tau_sum;
            staleness[2 * s + 1] = tau_max;
        }
    }
    return 0;
}

ASYNCOPT_EXPORT int asyncopt_svrg_epoch_group(
    const int64_t *indptr, const int32_t *indices, const double *data, const double *y,
    int code, const double *sample_weight, double *x, double *intercept,
    double eta_intercept, const double *z_snap, const double *weighted_mu, double mu_intercept, const double *thresholds, double eta,
    const int64_t *samples, int64_t n_samples, int variance_reduced, int n_threads,
    int64_t *clock, int64_t *staleness, const int64_t *block_indptr,
    const int64_t *feature_block, int64_t n_blocks, int64_t n_features)
{
    if (n_threads < 1 || n_samples < 0 || n_blocks < 0 || n_features < 0)
        return 2;

    int64_t max_size = 0;
    for (int64_t g = 0; g < n_blocks; g++)
        max_size = nb_max_i64(max_size, block_indptr[g + 1] - block_indptr[g]);

    int failed = 0;

#pragma omp parallel num_threads(n_threads)
    {
        int team = 1, tid = 0;
#ifdef _OPENMP
        team = omp_get_num_threads();
        tid = omp_get_thread_num();
#endif
        /* per-thread buffers (numba: scratch, stamp, touched, old, new) */
        double *scratch = calloc((size_t)(n_features > 0 ? n_features : 1), sizeof(double));
        int64_t *stamp = malloc((size_t)(n_blocks > 0 ? n_blocks : 1) * sizeof(int64_t));
        int64_t *touched = malloc((size_t)(n_blocks > 0 ? n_blocks : 1) * sizeof(int64_t));
        double *old = malloc((size_t)(max_size > 0 ? max_size : 1) * sizeof(double));
        double *new_ = malloc((size_t)(max_size > 0 ? max_size : 1) * sizeof(double));

        if (!scratch || !stamp || !touched || !old || !new_) {
            __atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
        } else {
            for (int s = tid; s < n_threads; s += team) {
                int64_t start, end;
                split_bounds(n_samples, n_threads, s, &start, &end);
                for (int64_t g = 0; g < n_blocks; g++)
                    stamp[g] = -1;
                double b = load_relaxed(intercept), delta = 0.0;
                int64_t tau_sum = staleness[2 * s], tau_max = staleness[2 * s + 1];
                for (int64_t t = start; t < end; t++) {
                    int64_t step = t - start; /* numba's loop counter, stamps the blocks */
                    int64_t i = samples[t];
                    int64_t seen = clock_read(clock);
                    double z = row_margin(indptr, indices, data, x, b, i);
                    double diff = gradient_difference(code, z, z_snap[i], y[i],
                                                      row_weight(sample_weight, i),
                                                      variance_reduced);
                    int64_t n_touched = 0;
                    for (int64_t k = indptr[i]; k < indptr[i + 1]; k++) {
                        int64_t j = indices[k];
                        scratch[j] += diff * data[k];
                        int64_t g = feature_block[j];
                        if (stamp[g] != step) {
                            stamp[g] = step;
                            touched[n_touched] = g;
                            n_touched++;
                        }
                    }
                    for (int64_t m = 0; m < n_touched; m++) {
                        int64_t g = touched[m];
                        int64_t bstart = block_indptr[g];
                        int64_t size = block_indptr[g + 1] - bstart;
                        for (int64_t q = 0; q < size; q++) {
                            old[q] = load_relaxed(&x[bstart + q]);
                            new_[q] = old[q] - eta * (scratch[bstart + q] +
                                                      weighted_mu[bstart + q]);
                            scratch[bstart + q] = 0.0;
                        }
                        /* penalties.py: block_soft_threshold_ */
                        double sq = 0.0;
                        for (int64_t q = 0; q < size; q++)
                            sq += new_[q] * new_[q];
                        double norm = sqrt(sq);
                        double scale = norm <= thresholds[g] ? 0.0 : 1.0 - thresholds[g] / norm;
                        for (int64_t q = 0; q < size; q++)
                            new_[q] *= scale;
                        for (int64_t q = 0; q < size; q++)
                            atomic_add(&x[bstart + q], new_[q] - old[q]);
                    }
                    step_intercept(intercept, &b, &delta,
                                   eta_intercept * (diff + mu_intercept), step);
                    int64_t now = clock_tick(clock);
                    tau_sum += now - seen;
                    tau_max = nb_max_i64(tau_max, now - seen);
                }
                atomic_add(intercept, delta);
                staleness[2 * s] = tau_sum;
                staleness[2 * s + 1] = tau_max;
            }
        }
        free(scratch);
        free(stamp);
        free(touched);
        free(old);
        free(new_);
    }
    return failed ? 1 : 0;
}
