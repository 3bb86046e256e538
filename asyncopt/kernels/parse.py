"""LIBSVM text to CSR arrays in one pass, with exactly rounded decimal conversion.

A number ``[+-]digits[.digits][(e|E)[+-]digits]`` is read as an integer mantissa m of at
most 19 significant digits and a power of ten q, and converted to the double nearest
m * 10^q (ties to even, what ``float()`` and C's ``strtod`` give):
- Clinger's fast path where m < 2^53 and |q| <= 22 (both exact, one rounding);
- else the Eisel-Lemire algorithm (D. Lemire, "Number parsing at a gigabyte per second",
  Software: Practice and Experience 51(8), 2021; Go's strconv.eiselLemire64): m times a
  128-bit truncation of 10^q, accepted when the truncation cannot change the rounding.
A number it cannot settle (more than 19 significant digits, a result outside the normal
range, or an ambiguous product) is left to Python's ``float`` by the caller; the kernel
records where it stands.
"""
import math

import numpy as np
from numba import njit

POW10_MIN, POW10_MAX = -348, 347


def pow10_table():
    """(hi, lo) uint64 arrays: the 128 leading bits of 10^q, rounded down, for
    POW10_MIN <= q <= POW10_MAX (row q - POW10_MIN), from exact integers."""
    hi = np.empty(POW10_MAX - POW10_MIN + 1, dtype=np.uint64)
    lo = np.empty_like(hi)
    for q in range(POW10_MIN, POW10_MAX + 1):
        if q >= 0:
            v = 10 ** q
            bits = v.bit_length()
            m = v >> (bits - 128) if bits > 128 else v << (128 - bits)
        else:
            d = 10 ** -q
            m = (1 << (d.bit_length() + 127)) // d
        hi[q - POW10_MIN] = m >> 64
        lo[q - POW10_MIN] = m & ((1 << 64) - 1)
    return hi, lo


POW10_HI, POW10_LO = pow10_table()
EXACT_POW10 = np.array([10.0 ** k for k in range(23)])
_TWO53 = 1 << 53
_INT32_MAX = 2 ** 31 - 1

# parse_libsvm_chunk's status codes
OK, BAD_LINE, INDEX_TOO_LARGE = 0, 1, 2


@njit(cache=True, inline="always")
def _mul64(a, b):
    """(hi, lo) words of the 128-bit product of two uint64 (Go's bits.Mul64)."""
    mask = np.uint64(0xFFFFFFFF)
    s32 = np.uint64(32)
    a0, a1 = a & mask, a >> s32
    b0, b1 = b & mask, b >> s32
    w0 = a0 * b0
    t = a1 * b0 + (w0 >> s32)
    w1 = (t & mask) + a0 * b1
    hi = a1 * b1 + (t >> s32) + (w1 >> s32)
    return hi, a * b


@njit(cache=True, inline="always")
def _leading_zeros(x):
    n = 0
    for shift in (32, 16, 8, 4, 2, 1):
        if x >> np.uint64(64 - shift) == np.uint64(0):
            n += shift
            x = x << np.uint64(shift)
    return n


@njit(cache=True)
def eisel_lemire(man, q, pow_hi, pow_lo):
    """(ok, |value|): the double nearest man * 10^q (man a nonzero uint64); ok False when
    the 128-bit product cannot decide the rounding or the result is not a normal double."""
    if q < POW10_MIN or q > POW10_MAX:
        return False, 0.0
    clz = _leading_zeros(man)
    man = man << np.uint64(clz)
    exp2 = ((217706 * q) >> 16) + 64 + 1023 - clz
    row = q - POW10_MIN
    x_hi, x_lo = _mul64(man, pow_hi[row])
    one_ff = np.uint64(0x1FF)
    if (x_hi & one_ff) == one_ff and x_lo + man < man:
        y_hi, y_lo = _mul64(man, pow_lo[row])
        merged_hi, merged_lo = x_hi, x_lo + y_hi
        if merged_lo < x_lo:
            merged_hi += np.uint64(1)
        if ((merged_hi & one_ff) == one_ff and merged_lo + np.uint64(1) == np.uint64(0)
                and y_lo + man < man):
            return False, 0.0
        x_hi, x_lo = merged_hi, merged_lo
    msb = x_hi >> np.uint64(63)
    mantissa = x_hi >> (msb + np.uint64(9))
    exp2 -= 1 - int(msb)
    if x_lo == np.uint64(0) and (x_hi & one_ff) == np.uint64(0) and \
            (mantissa & np.uint64(3)) == np.uint64(1):
        return False, 0.0
    mantissa += mantissa & np.uint64(1)
    mantissa = mantissa >> np.uint64(1)
    if mantissa >> np.uint64(53) > np.uint64(0):
        mantissa = mantissa >> np.uint64(1)
        exp2 += 1
    if exp2 <= 0 or exp2 >= 0x7FF:
        return False, 0.0
    return True, math.ldexp(float(mantissa), exp2 - 1075)


@njit(cache=True)
def parse_decimal(buf, start, end, pow_hi, pow_lo):
    """(status, value) of the number in buf[start:end]: status 0 converted, 1 well formed
    but left to Python's float (see the module docstring), 2 not a decimal number."""
    i = start
    negative = False
    if i < end and (buf[i] == 43 or buf[i] == 45):        # + -
        negative = buf[i] == 45
        i += 1
    man = np.uint64(0)
    digits = 0              # significant digits taken into man
    dropped = False         # a nonzero digit past the 19th
    shift = 0               # power of ten the digits' position adds
    seen = 0
    point = False
    while i < end:
        c = buf[i]
        if 48 <= c <= 57:
            seen += 1
            if digits < 19:
                if man != np.uint64(0) or c != 48:
                    man = man * np.uint64(10) + np.uint64(c - 48)
                    digits += 1
                if point:
                    shift -= 1
            else:
                dropped = dropped or c != 48
                if not point:
                    shift += 1
        elif c == 46 and not point:                        # .
            point = True
        else:
            break
        i += 1
    if seen == 0:
        return 2, 0.0
    if i < end and (buf[i] == 101 or buf[i] == 69):       # e E
        i += 1
        exp_negative = False
        if i < end and (buf[i] == 43 or buf[i] == 45):
            exp_negative = buf[i] == 45
            i += 1
        exp_digits = 0
        exponent = 0
        while i < end and 48 <= buf[i] <= 57:
            if exponent < 100000:
                exponent = exponent * 10 + (buf[i] - 48)
            exp_digits += 1
            i += 1
        if exp_digits == 0:
            return 2, 0.0
        shift += -exponent if exp_negative else exponent
    if i != end:
        return 2, 0.0
    if dropped:
        return 1, 0.0
    sign = -1.0 if negative else 1.0
    if man == np.uint64(0):
        return 0, sign * 0.0
    if man < np.uint64(_TWO53) and -22 <= shift <= 22:
        value = float(man)
        value = value * EXACT_POW10[shift] if shift >= 0 else value / EXACT_POW10[-shift]
        return 0, sign * value
    ok, value = eisel_lemire(man, shift, pow_hi, pow_lo)
    if not ok:
        return 1, 0.0
    return 0, sign * value


@njit(cache=True, inline="always")
def _is_space(c):
    return c == 32 or c == 9 or c == 13 or c == 11 or c == 12


@njit(cache=True, inline="always")
def _push_fallback(fallback, count, position, start, end):
    """fallback (grown twice over when full) with row ``count`` set to (position, start,
    end). A loop copies it: numba's slice assignment compiles its broadcasting errors'
    formatting, seconds of a first run."""
    if count == fallback.shape[0]:
        grown = np.empty((2 * count, 3), dtype=np.int64)
        for r in range(count):
            for c in range(3):
                grown[r, c] = fallback[r, c]
        fallback = grown
    fallback[count, 0] = position
    fallback[count, 1] = start
    fallback[count, 2] = end
    return fallback


@njit(cache=True, nogil=True)
def parse_libsvm_chunk(buf, zero_based, max_index, pow_hi, pow_lo):
    """Parse whole LIBSVM lines ``label [qid:Q] index:value ...`` ('#' starts a comment;
    blank lines skipped) from the uint8 array ``buf``.

    zero_based: 1 or 0 (index 0 is then an error) or -1 (either). max_index: the largest
    index allowed as written (-1: no bound). Returns (status, line, y, row_line, indptr,
    indices, data, fallback): status OK, BAD_LINE or INDEX_TOO_LARGE at 0-based ``line``
    of buf (then the arrays are partial); row_line[r] the line of row r; indices as
    written; ``fallback`` rows (position, start, end): numbers for Python's float, where
    position k >= 0 is data[k] and k < 0 is y[-k - 1]."""
    n = buf.shape[0]
    max_rows = 1
    max_nnz = 0
    for k in range(n):
        if buf[k] == 10:
            max_rows += 1
        elif buf[k] == 58:
            max_nnz += 1
    y = np.empty(max_rows, dtype=np.float64)
    row_line = np.empty(max_rows, dtype=np.int64)
    indptr = np.zeros(max_rows + 1, dtype=np.int64)
    indices = np.empty(max_nnz, dtype=np.int64)
    data = np.empty(max_nnz, dtype=np.float64)
    fallback = np.empty((16, 3), dtype=np.int64)
    n_fallback = 0
    rows = 0
    nnz = 0
    line = 0
    pos = 0
    status = OK
    while pos < n:
        eol = pos
        while eol < n and buf[eol] != 10:
            eol += 1
        end = pos
        while end < eol and buf[end] != 35:                 # '#'
            end += 1
        p = pos
        while p < end and _is_space(buf[p]):
            p += 1
        if p < end:
            t = p
            while t < end and not _is_space(buf[t]):
                t += 1
            code, value = parse_decimal(buf, p, t, pow_hi, pow_lo)
            if code == 2:
                status = BAD_LINE
                break
            if code == 1:
                fallback = _push_fallback(fallback, n_fallback, -rows - 1, p, t)
                n_fallback += 1
            y[rows] = value
            p = t
            previous = -1
            first = True
            while True:
                while p < end and _is_space(buf[p]):
                    p += 1
                if p >= end:
                    break
                t = p
                colon = -1
                while t < end and not _is_space(buf[t]):
                    if buf[t] == 58 and colon < 0:
                        colon = t
                    t += 1
                if first and t - p > 4 and buf[p] == 113 and buf[p + 1] == 105 and \
                        buf[p + 2] == 100 and buf[p + 3] == 58:      # qid:
                    first = False
                    p = t
                    continue
                first = False
                if colon <= p or colon == t - 1:
                    status = BAD_LINE
                    break
                index = 0
                for k in range(p, colon):
                    c = buf[k]
                    if c < 48 or c > 57 or index > _INT32_MAX:
                        status = BAD_LINE
                        break
                    index = index * 10 + (c - 48)
                if status != OK:
                    break
                if index > _INT32_MAX or index <= previous or \
                        (index == 0 and zero_based == 0):
                    status = BAD_LINE
                    break
                if max_index >= 0 and index > max_index:
                    status = INDEX_TOO_LARGE
                    break
                code, value = parse_decimal(buf, colon + 1, t, pow_hi, pow_lo)
                if code == 2:
                    status = BAD_LINE
                    break
                if code == 1:
                    fallback = _push_fallback(fallback, n_fallback, nnz, colon + 1, t)
                    n_fallback += 1
                indices[nnz] = index
                data[nnz] = value
                nnz += 1
                previous = index
                p = t
            if status != OK:
                break
            row_line[rows] = line
            rows += 1
            indptr[rows] = nnz
        pos = eol + 1
        line += 1
    return (status, line, y[:rows], row_line[:rows], indptr[:rows + 1], indices[:nnz],
            data[:nnz], fallback[:n_fallback])
