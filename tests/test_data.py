import io
import itertools
import lzma
import os
import time
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import dump_svmlight_file, load_svmlight_file

from asyncopt.data import (
    LibsvmFormatError,
    feature_crosses,
    libsvm_byte_ranges,
    load_a9a,
    load_libsvm,
    make_ctr,
)

SHARED_A9A = Path(__file__).resolve().parents[2] / "shared" / "data" / "a9a"


def random_sparse(n, d, density, seed, binary=False):
    rng = np.random.default_rng(seed)
    X = sp.random(n, d, density=density, format="csr", random_state=rng)
    if binary:
        X.data[:] = 1.0
    else:
        X.data = np.round(rng.standard_normal(X.nnz), 6)
    return X


def assert_same_csr(A, B):
    assert A.shape == B.shape
    assert (A != B).nnz == 0


def check_csr(X):
    assert sp.issparse(X) and X.format == "csr"
    assert X.dtype == np.float64
    assert X.indices.dtype in (np.int32, np.int64)
    for i in range(X.shape[0]):
        assert np.all(np.diff(X.indices[X.indptr[i]:X.indptr[i + 1]]) > 0)


@pytest.mark.parametrize("zero_based", [True, False])
@pytest.mark.parametrize("suffix", ["", ".gz", ".xz"])
def test_load_libsvm_round_trip(tmp_path, zero_based, suffix):
    X = random_sparse(200, 37, 0.1, seed=1).tolil()
    X[5, 36] = 2.5
    X = X.tocsr()
    y = np.random.default_rng(2).integers(-1, 2, 200).astype(float)
    plain = tmp_path / "data.svm"
    dump_svmlight_file(X, y, str(plain), zero_based=zero_based)
    path = tmp_path / ("data.svm" + suffix)
    if suffix == ".gz":
        import gzip
        path.write_bytes(gzip.compress(plain.read_bytes()))
    elif suffix == ".xz":
        path.write_bytes(lzma.compress(plain.read_bytes()))
    X2, y2 = load_libsvm(path, n_features=37, zero_based=zero_based)
    check_csr(X2)
    assert_same_csr(X2, X)
    np.testing.assert_array_equal(y2, y)
    X3, _ = load_libsvm(str(path), zero_based="auto", n_features=37)
    assert_same_csr(X3, X)


def write_lines(path, lines, trailing_newline=True):
    path.write_text("\n".join(lines) + ("\n" if trailing_newline else ""))
    return path


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("trailing_newline", [True, False])
@pytest.mark.parametrize("n_parts", [1, 2, 3, 4, 7, 16, 40, 97])
def test_byte_range_shards_concatenate_to_whole_file(tmp_path, n_parts, trailing_newline,
                                                     threads):
    """Each range is read whole and parsed where it lies, in ``threads`` pieces."""
    X = random_sparse(60, 20, 0.15, seed=3)
    y = np.arange(60, dtype=float)
    path = tmp_path / "data.svm"
    dump_svmlight_file(X, y, str(path), zero_based=False)
    lines = path.read_text().splitlines()
    lines.insert(10, "# a comment line")
    lines.insert(20, "")
    lines.insert(0, "")
    write_lines(path, lines, trailing_newline)
    X_all, y_all = load_libsvm(path, n_features=20, zero_based=False)
    ranges = libsvm_byte_ranges(path, n_parts)
    assert len(ranges) == n_parts
    size = os.path.getsize(path)
    assert all(0 <= o <= size and length >= 0 for o, length in ranges)
    shards = [load_libsvm(path, n_features=20, zero_based=False, offset=o, length=length,
                          n_threads=threads) for o, length in ranges]
    assert all(s[0].shape[1] == 20 for s in shards)
    np.testing.assert_array_equal(np.concatenate([s[1] for s in shards]), y_all)
    assert_same_csr(sp.vstack([s[0] for s in shards]).tocsr(), X_all)
    if n_parts <= 16:
        assert all(s[0].shape[0] > 0 for s in shards)


def test_every_line_as_its_own_byte_range(tmp_path):
    lines = ["1 1:1", "# comment", "", "2 2:1 3:1", "   ", "3 1:2 # trailing", "# end"]
    path = write_lines(tmp_path / "lines.svm", lines)
    data = path.read_bytes()
    starts = [0] + [i + 1 for i, byte in enumerate(data[:-1]) if byte == ord("\n")]
    ranges = [(0, starts[1] - 1)] + [
        (s - 1, e - s) for s, e in zip(starts[1:], starts[2:] + [len(data)])]
    shards = [load_libsvm(path, n_features=4, zero_based=False, offset=o, length=n)
              for o, n in ranges]
    assert [s[0].shape[0] for s in shards] == [1, 0, 0, 1, 0, 1, 0]
    np.testing.assert_array_equal(np.concatenate([s[1] for s in shards]), [1, 2, 3])
    X_all, _ = load_libsvm(path, n_features=4, zero_based=False)
    assert_same_csr(sp.vstack([s[0] for s in shards]).tocsr(), X_all)


def test_byte_ranges_on_shared_a9a_are_balanced():
    if not SHARED_A9A.exists():
        pytest.skip("shared a9a file not present")
    ranges = libsvm_byte_ranges(SHARED_A9A, 8)
    rows = [load_libsvm(SHARED_A9A, 123, False, o, n)[0].shape[0] for o, n in ranges]
    assert sum(rows) == 32560
    assert max(rows) - min(rows) < 0.02 * 32560 / 8


GOOD = ["1 1:0.5 3:2", "-1 2:1", "1 1:1 4:3", "0 3:1 # comment", "1 2:2"]
BAD = [
    ("abc 1:1", "label"),
    ("1 x:1.0", "x:1.0"),
    ("1 3", "'3'"),
    ("1 2:", "2:"),
    ("1 2:1.0.0", "2:1.0.0"),
    ("1 -3:1", "-3:1"),
    ("1 2:nan", "2:nan"),
    ("1 2:inf", "2:inf"),
    ("nan 1:1", "nan"),
    ("1 3:1 2:1", "2:1"),
    ("1 2:1 2:1", "2:1"),
    ("1 1:1 99999999999999999999:1", "99999999999999999999"),
]


@pytest.mark.parametrize("bad, shown", BAD)
def test_malformed_line_is_reported_with_file_and_line(tmp_path, bad, shown):
    lines = list(GOOD)
    lines[2] = bad
    path = write_lines(tmp_path / "broken.svm", lines)
    with pytest.raises(LibsvmFormatError) as info:
        load_libsvm(path)
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert "\n" not in message
    assert message.startswith(f"{path}:3: ")
    assert shown in message


def test_malformed_line_in_a_shard_reports_the_file_line(tmp_path):
    lines = [f"1 {i % 7 + 1}:1" for i in range(50)]
    lines[41] = "1 4:oops"
    path = write_lines(tmp_path / "big.svm", lines)
    ranges = libsvm_byte_ranges(path, 4)
    errors = []
    for offset, length in ranges:
        try:
            load_libsvm(path, n_features=8, zero_based=False, offset=offset, length=length)
        except LibsvmFormatError as error:
            errors.append(str(error))
    assert len(errors) == 1
    assert errors[0].startswith(f"{path}:42: ") and "4:oops" in errors[0]


def test_index_zero_in_one_based_file(tmp_path):
    lines = list(GOOD)
    lines[2] = "1 0:1 2:1"
    path = write_lines(tmp_path / "zero.svm", lines)
    with pytest.raises(LibsvmFormatError, match=r"zero\.svm:3: .*0:1"):
        load_libsvm(path, zero_based=False)
    X, _ = load_libsvm(path, zero_based="auto")
    assert X.shape == (5, 4)


def test_index_beyond_n_features(tmp_path):
    lines = list(GOOD)
    lines[3] = "1 2:1 9:1"
    path = write_lines(tmp_path / "wide.svm", lines)
    with pytest.raises(LibsvmFormatError, match=r"wide\.svm:4: .*n_features=5"):
        load_libsvm(path, n_features=5)


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n  \n"])
def test_file_without_rows_is_rejected(tmp_path, text):
    path = tmp_path / "empty.svm"
    path.write_text(text)
    with pytest.raises(LibsvmFormatError, match="empty.svm: no data rows"):
        load_libsvm(path)


def test_missing_file(tmp_path):
    path = tmp_path / "nowhere.svm"
    with pytest.raises(FileNotFoundError, match="nowhere.svm"):
        load_libsvm(path)
    with pytest.raises(FileNotFoundError, match="nowhere.svm"):
        libsvm_byte_ranges(path, 2)


def test_byte_range_requires_n_features(tmp_path):
    path = write_lines(tmp_path / "d.svm", GOOD)
    with pytest.raises(ValueError, match="n_features"):
        load_libsvm(path, offset=3, length=5)


def test_make_ctr_shape_rows_and_norms():
    X, y, coef = make_ctr(3000, 2000, nnz_per_row=25, random_state=0)
    check_csr(X)
    assert X.shape == (3000, 2000) and y.shape == (3000,) and coef.shape == (2000,)
    np.testing.assert_array_equal(np.diff(X.indptr), 25)
    np.testing.assert_allclose(np.sqrt(X.multiply(X).sum(axis=1)).A1, 1.0)
    assert np.count_nonzero(coef) == 20
    np.testing.assert_allclose((X @ coef).std(), 1.0)
    assert np.std(y - X @ coef) == pytest.approx(0.1, rel=0.1)
    X1, _, _ = make_ctr(100, 50, nnz_per_row=5, normalize_rows=False, random_state=0)
    np.testing.assert_array_equal(X1.data, 1.0)


def test_make_ctr_popularity_is_a_decreasing_power_law():
    n, d, k, s = 20000, 5000, 20, 1.1
    X, _, _ = make_ctr(n, d, nnz_per_row=k, zipf_exponent=s, random_state=1)
    counts = np.bincount(X.indices, minlength=d).astype(float)
    assert counts[:10].min() > 50 * np.median(counts)
    ranks = np.arange(1, d + 1)
    band = slice(50, 2000)
    slope = np.polyfit(np.log(ranks[band]), np.log(counts[band]), 1)[0]
    assert -1.3 < slope < -0.9
    assert np.all(counts[:10] <= n)


def test_make_ctr_samples_without_replacement_exactly():
    n = 100000
    X, _, _ = make_ctr(n, 3, nnz_per_row=2, zipf_exponent=1.0, random_state=2)
    p = np.array([1, 1 / 2, 1 / 3]) / (1 + 1 / 2 + 1 / 3)
    missing = np.zeros(3)
    for a, b in itertools.permutations(range(3), 2):
        missing[3 - a - b] += p[a] * p[b] / (1 - p[a])
    observed = 1 - np.bincount(X.indices, minlength=3) / n
    np.testing.assert_allclose(observed, missing, atol=0.01)


def test_make_ctr_dense_rows_fall_back_to_exact_sampling():
    X, _, _ = make_ctr(500, 40, nnz_per_row=38, zipf_exponent=2.0, random_state=3)
    np.testing.assert_array_equal(np.diff(X.indptr), 38)
    check_csr(X)


def test_make_ctr_logistic_labels_and_determinism():
    X, y, coef = make_ctr(4000, 1000, loss="logistic", random_state=5)
    assert set(np.unique(y)) == {-1.0, 1.0}
    assert np.mean(np.sign(X @ coef) == y) > 0.6
    X2, y2, coef2 = make_ctr(4000, 1000, loss="logistic", random_state=5)
    assert_same_csr(X, X2)
    np.testing.assert_array_equal(y, y2)
    np.testing.assert_array_equal(coef, coef2)
    X3, _, _ = make_ctr(4000, 1000, loss="logistic", random_state=6)
    assert (X3 != X).nnz > 0


@pytest.mark.perf
def test_make_ctr_is_fast_at_ctr_scale():
    """A timing check (-m perf): CTR scale within 15 s; the rows' structure it checks
    at that scale is test_make_ctr_shape_rows_and_norms' at a small one."""
    start = time.perf_counter()
    X, _, _ = make_ctr(200_000, 100_000, nnz_per_row=30, random_state=0)
    assert time.perf_counter() - start < 15.0
    assert X.nnz == 6_000_000
    np.testing.assert_array_equal(np.diff(X.indptr), 30)
    assert np.all(np.diff(X.indices.reshape(-1, 30), axis=1) > 0)


def test_make_ctr_rejects_bad_arguments():
    with pytest.raises(ValueError):
        make_ctr(10, 5, nnz_per_row=6)
    with pytest.raises(ValueError):
        make_ctr(10, 5, nnz_per_row=2, loss="hinge")


def brute_force_crosses(X, degree, include_original):
    D = X.toarray()
    d = D.shape[1]
    columns, index = [], []
    if include_original:
        columns += [D[:, j] for j in range(d)]
        index += [(j,) for j in range(d)]
    for k in range(2, degree + 1):
        for combo in itertools.combinations(range(d), k):
            product = np.prod(D[:, list(combo)], axis=1)
            if np.any(product != 0):
                columns.append(product)
                index.append(combo)
    return np.column_stack(columns), index


@pytest.mark.parametrize("degree", [2, 3])
@pytest.mark.parametrize("include_original", [True, False])
@pytest.mark.parametrize("binary", [True, False])
def test_feature_crosses_match_brute_force(degree, include_original, binary):
    X = random_sparse(60, 14, 0.2, seed=degree + 10 * binary, binary=binary)
    X = sp.vstack([X, sp.csr_matrix((2, 14))]).tocsr()
    expected, expected_index = brute_force_crosses(X, degree, include_original)
    Z, index = feature_crosses(X, degree=degree, include_original=include_original,
                               return_index=True)
    check_csr(Z)
    np.testing.assert_array_equal(Z.toarray(), expected)
    assert index.shape == (len(expected_index), degree)
    padded = [tuple(c) + (-1,) * (degree - len(c)) for c in expected_index]
    assert [tuple(r) for r in index] == padded
    assert len(expected_index) < (14 if include_original else 0) + sum(
        len(list(itertools.combinations(range(14), k))) for k in range(2, degree + 1))


def test_feature_crosses_degree_one_and_errors():
    X = random_sparse(20, 6, 0.3, seed=4, binary=True)
    assert_same_csr(feature_crosses(X, degree=1), X)
    with pytest.raises(ValueError):
        feature_crosses(X, degree=4)
    with pytest.raises(TypeError):
        feature_crosses(X.toarray())


def test_load_a9a():
    X, y = load_a9a()
    check_csr(X)
    assert X.shape == (32560, 123)
    assert set(np.unique(y)) == {-1.0, 1.0}
    assert set(np.unique(X.data)) == {1.0}
    _, y01 = load_a9a(labels="01")
    np.testing.assert_array_equal(y01, (y + 1) / 2)
    # the binary form it is read from (a9a.npz) against the embedded LIBSVM text, parsed
    # by load_libsvm (kernels.parse) and by scikit-learn
    from importlib import resources
    from asyncopt.data.embedded import A9A_ARRAYS, a9a_arrays_from_text, a9a_from_text
    with resources.files("asyncopt.data").joinpath(A9A_ARRAYS).open("rb") as f, \
            np.load(f) as stored:
        for name, array in a9a_arrays_from_text().items():   # the file's recipe
            np.testing.assert_array_equal(stored[name], array)
            assert stored[name].dtype == array.dtype
    X_text, y_text = a9a_from_text()
    assert_same_csr(X, X_text)
    np.testing.assert_array_equal(y01, y_text)
    with resources.files("asyncopt.data").joinpath("a9a.svm.xz").open("rb") as f:
        X_sk, y_sk = load_svmlight_file(io.BytesIO(lzma.decompress(f.read())),
                                        n_features=123, zero_based=False)
    assert_same_csr(X, X_sk)
    np.testing.assert_array_equal(y01, y_sk)
    if SHARED_A9A.exists():
        X_ref, y_ref = load_libsvm(SHARED_A9A, n_features=123, zero_based=False)
        assert_same_csr(X, X_ref)
        np.testing.assert_array_equal(y01, y_ref)


def test_load_a9a_returns_independent_copies():
    X, y = load_a9a()
    X.data[:] = 7.0
    y[:] = 0.0
    X2, y2 = load_a9a()
    assert set(np.unique(X2.data)) == {1.0}
    assert set(np.unique(y2)) == {-1.0, 1.0}


def test_load_a9a_crosses():
    X1, _ = load_a9a()
    X2, y2 = load_a9a(degree=2)
    assert X2.shape[0] == 32560 and 2000 < X2.shape[1] < 10000
    assert_same_csr(X2[:, :123], X1)
    pairs = X1.T @ X1
    assert X2.shape[1] == 123 + sp.triu(pairs, k=1).nnz
    with pytest.raises(ValueError):
        load_a9a(labels="yes")


def test_load_a9a_degree_three():
    X1, _ = load_a9a()
    X3, y = load_a9a(degree=3)
    Z, index = feature_crosses(X1, degree=3, return_index=True)
    assert X3.shape == Z.shape == (32560, index.shape[0])
    assert 20_000 < X3.shape[1] < 400_000
    triples = np.flatnonzero(index[:, 2] >= 0)
    assert triples[0] == 123 + np.count_nonzero((index[:, 1] >= 0) & (index[:, 2] < 0))
    dense1 = X1.toarray()
    for c in triples[:: max(1, len(triples) // 25)]:
        j, k, m = index[c]
        np.testing.assert_array_equal(X3[:, c].toarray().ravel(),
                                      dense1[:, j] * dense1[:, k] * dense1[:, m])
