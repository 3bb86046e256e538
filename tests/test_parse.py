"""kernels.parse and load_libsvm's parser against independent references: Python's float
(bit for bit), scikit-learn's load_svmlight_file, and the exact powers of ten."""
import random
import struct

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import load_svmlight_file

from asyncopt.data import LibsvmFormatError, load_libsvm, save_libsvm
from asyncopt.data import libsvm as libsvm_module
from asyncopt.kernels.parse import POW10_HI, POW10_LO, POW10_MIN, parse_decimal


def convert(text):
    buf = np.frombuffer(text.encode(), dtype=np.uint8)
    return parse_decimal(buf, 0, buf.shape[0], POW10_HI, POW10_LO)


def bits(value):
    return struct.pack("<d", value)


def test_power_of_ten_table_matches_exact_values_and_gos_table():
    # entries of Go's strconv detailedPowersOfTen (rounded down)
    assert (POW10_HI[0], POW10_LO[0]) == (0xFA8FD5A0081C0288, 0x1732C869CD60E453)
    assert (POW10_HI[-1], POW10_LO[-1]) == (0xD13EB46469447567, 0x4B7195F2D2D1A9FB)
    for q in (-300, -25, -1, 0, 1, 22, 23, 100, 300):
        m = (int(POW10_HI[q - POW10_MIN]) << 64) | int(POW10_LO[q - POW10_MIN])
        assert m >> 127 == 1
        # m = floor(10^q * 2^s) for the s that puts the top bit at 127
        if q >= 0:
            s = 128 - (10 ** q).bit_length()
            exact = 10 ** q << s if s >= 0 else (10 ** q) >> -s
        else:
            d = 10 ** -q
            exact = (1 << (d.bit_length() + 127)) // d
        assert m == exact


def random_number_texts(count, seed):
    rng = random.Random(seed)
    texts = []
    while len(texts) < count:
        kind = rng.random()
        if kind < 0.3:
            value = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
            if not np.isfinite(value):
                continue
            text = repr(value)
        elif kind < 0.6:
            text = f"%.{rng.randint(1, 17)}g" % (rng.random() * 10.0 ** rng.randint(-30, 30))
        elif kind < 0.8:
            text = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 24)))
            if rng.random() < 0.5:
                at = rng.randint(0, len(text))
                text = text[:at] + "." + text[at:]
            if rng.random() < 0.5:
                text += rng.choice("eE") + str(rng.randint(-330, 310))
        else:
            text = f"{rng.randint(0, 10 ** rng.randint(1, 19))}e{rng.randint(-30, 30)}"
        if rng.random() < 0.3 and text[0] != "-":
            text = rng.choice("+-") + text
        texts.append(text)
    return texts


def test_decimal_conversion_is_python_float_bit_for_bit():
    converted = 0
    for text in random_number_texts(40_000, seed=0):
        status, value = convert(text)
        if status == 2:
            with pytest.raises(ValueError):
                float(text)
            continue
        if status == 0:
            assert bits(value) == bits(float(text)), text
            converted += 1
    assert converted > 35_000      # the fallback to Python's float is the exception


@pytest.mark.parametrize("text, expected", [
    ("9007199254740995", 9007199254740996.0),           # a tie above 2^53, to even
    ("2.2250738585072014e-308", 2.2250738585072014e-308),   # smallest normal
    ("1.7976931348623157e308", 1.7976931348623157e308),
    ("-0", -0.0), ("0e999", 0.0), ("+.5", 0.5), ("5.", 5.0), ("1E+05", 1e5),
    ("00000000000000000000000001.5", 1.5),
    ("0.1000000000000000000000000", 0.1),               # zeros past the 19th digit
])
def test_decimal_conversion_edge_cases(text, expected):
    status, value = convert(text)
    assert status == 0 and bits(value) == bits(expected)


@pytest.mark.parametrize("text", ["9007199254740993", "4.9e-324", "1e-400", "1e400",
                                  "12345678901234567890123e-3"])
def test_numbers_the_kernel_cannot_settle_are_left_to_python(text):
    assert convert(text)[0] == 1


@pytest.mark.parametrize("text", ["", ".", "e5", "1e", "--1", "1.2.3", "0x10", "inf", "nan",
                                  "1_0", "1:2"])
def test_non_decimal_text_is_rejected(text):
    assert convert(text)[0] == 2


def write_messy_file(path, n, p, seed, zero_based):
    """A LIBSVM file with every number format and line shape the format allows."""
    rng = random.Random(seed)
    texts = random_number_texts(4 * n * 6, seed + 1)
    texts = [t for t in texts if 0 < abs(float(t)) < 1e300 and abs(float(t)) > 1e-300]
    lines = []
    k = 0
    for i in range(n):
        cols = sorted(rng.sample(range(p), rng.randint(0, 6)))
        tokens = [texts[k]]
        k += 1
        if rng.random() < 0.2:
            tokens.append(f"qid:{rng.randint(1, 9)}")
        for c in cols:
            tokens.append(f"{c + (0 if zero_based else 1)}:{texts[k]}")
            k += 1
        sep = rng.choice([" ", "  ", "\t"])
        line = sep.join(tokens)
        if rng.random() < 0.1:
            line += " # a comment 1:2"
        if rng.random() < 0.1:
            line += "\r"
        lines.append(line)
        if rng.random() < 0.05:
            lines.append(rng.choice(["", "   ", "# only a comment"]))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("zero_based", [True, False])
@pytest.mark.parametrize("block, threads", [(None, 1), (97, 1), (None, 3), (997, 4)])
def test_load_libsvm_equals_scikit_learn(tmp_path, monkeypatch, zero_based, block, threads):
    if block is not None:
        monkeypatch.setattr(libsvm_module, "_PARSE_BLOCK", block)   # many blocks
    path = write_messy_file(tmp_path / "messy.svm", 300, 50, seed=4, zero_based=zero_based)
    X, y = load_libsvm(path, n_features=50, zero_based=zero_based, n_threads=threads)
    X_ref, y_ref = load_svmlight_file(str(path), n_features=50, zero_based=zero_based)
    assert X.shape == X_ref.shape
    np.testing.assert_array_equal(X.indptr, X_ref.indptr)
    np.testing.assert_array_equal(X.indices, X_ref.indices)
    assert X.data.tobytes() == X_ref.data.astype(float).tobytes()
    assert y.tobytes() == np.asarray(y_ref, dtype=float).tobytes()
    X_auto, _ = load_libsvm(path)
    assert X_auto.shape[1] <= 50 and (X_auto != X[:, :X_auto.shape[1]]).nnz == 0


@pytest.mark.parametrize("block, threads", [(64, 1), (None, 1), (None, 5)])
def test_errors_in_a_later_piece_name_the_file_line(tmp_path, monkeypatch, block, threads):
    if block is not None:
        monkeypatch.setattr(libsvm_module, "_PARSE_BLOCK", block)
    lines = [f"{i} {i % 5 + 1}:0.{i}" for i in range(40)]
    lines[33] = "1 2:1e400"           # finite text, infinite value: Python's float decides
    lines[38] = "1 2:oops"            # the first error in line order is the one reported
    path = tmp_path / "late.svm"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(LibsvmFormatError, match=r"late\.svm:34: non-finite value in '2:1e400'"):
        load_libsvm(path, n_threads=threads)
    lines[38] = lines[37]
    lines[33] = "1 2:1 7:1"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(LibsvmFormatError, match=r"late\.svm:34: feature index 7 exceeds "
                                                r"n_features=6"):
        load_libsvm(path, n_features=6, zero_based=False, n_threads=threads)
    with pytest.raises(LibsvmFormatError, match=r"late\.svm:34: feature index 7 exceeds "
                                                r"n_features=6"):
        load_libsvm(path, n_features=6, n_threads=threads)  # "auto": one-based, known after
    X, _ = load_libsvm(path, n_features=7, n_threads=threads)
    assert X.shape == (40, 7)


def test_numbers_left_to_python_land_in_their_place(tmp_path):
    path = tmp_path / "long.svm"
    path.write_text("0.12345678901234567890123 1:4.9e-324 3:1\n"
                    "2 2:1e-400 3:123456789012345678901234567\n")
    X, y = load_libsvm(path, zero_based=False)
    assert bits(y[0]) == bits(0.12345678901234567890123) and y[1] == 2.0
    assert X.toarray().tolist() == [[5e-324, 0.0, 1.0], [0.0, 0.0, 1.2345678901234568e26]]
    assert X.nnz == 4       # the explicit 1e-400 (0.0) is kept, as scikit-learn keeps it


@pytest.mark.parametrize("suffix, zero_based", [("", False), (".gz", True), (".xz", False)])
def test_save_libsvm_reads_back_exactly(tmp_path, suffix, zero_based):
    """save_libsvm writes repr's shortest round-trip text: load_libsvm (and scikit-learn's
    reader) give back the same doubles, empty rows and extreme magnitudes included."""
    rng = np.random.default_rng(5)
    X = sp.random(60, 25, density=0.2, format="csr", random_state=rng)
    X.data = rng.standard_normal(X.nnz) * 10.0 ** rng.integers(-300, 300, X.nnz)
    X = X.tolil()
    X[3, :] = 0.0                                   # an empty row
    X[7, 24] = 5e-324                               # a subnormal in the last column
    X = X.tocsr()
    X.eliminate_zeros()
    y = rng.standard_normal(60) * 1e5
    path = tmp_path / ("out.svm" + suffix)
    save_libsvm(path, X, y, zero_based=zero_based, rows_per_write=7)
    X2, y2 = load_libsvm(path, n_features=25, zero_based=zero_based)
    assert X2.data.tobytes() == X.data.tobytes() and y2.tobytes() == y.tobytes()
    np.testing.assert_array_equal(X2.indices, X.indices)
    np.testing.assert_array_equal(X2.indptr, X.indptr)
    if suffix == "":
        X_ref, y_ref = load_svmlight_file(str(path), n_features=25, zero_based=zero_based)
        assert X_ref.data.tobytes() == X.data.tobytes()
    with pytest.raises(ValueError, match="finite"):
        save_libsvm(tmp_path / "bad.svm", X, np.full(60, np.nan))
    with pytest.raises(ValueError, match="60 rows but y has 59"):
        save_libsvm(tmp_path / "bad.svm", X, y[:59])
