"""Jitted reading of compact column batches straight from msgpack bytes. Plain arrays in,
plain arrays out.

Nothing but the kernels lives here; :mod:`pipeline.ingest.fast_batch` decides from what
:func:`read_batch` reports per column (types present, integer range, string flags) whether a
message can take the fast path, and if so has :func:`append_rows` append the fields it stores
to the growing columns of its kind. The kernels never raise on bad input: they report it, and
the message then takes the general path (``msgpack.unpackb`` and the column checks), which
names the reason.

Formats read (msgpack spec, github.com/msgpack/msgpack/blob/master/spec.md): nil, positive and
negative fixint, uint 8/16/32/64, int 8/16/32/64, float 32/64, fixstr and str 8/16/32 (UTF-8
checked), fixmap and map 16/32, fixarray and array 16/32 where the batch layout puts them.
Anything else (bool, bin, ext, a container inside a column, an unused byte) makes the whole
message ``OTHER``: the general path takes it.

UTF-8 is checked the way Python's strict ``utf-8`` codec does (so the fast path accepts exactly
the strings ``msgpack.unpackb(raw=False)`` accepts): no overlong forms (C0, C1, E0 < A0,
F0 < 90), no surrogates (ED >= A0), nothing past U+10FFFF (F4 >= 90, F5..FF), continuation
bytes 80..BF where expected and nowhere else.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from pipeline.ingest.events import MAX_ABS_NUMBER

# Element types, as bits of a column's type mask.
NIL, INT, BIG, FLOAT, STR, OTHER = 1, 2, 4, 8, 16, 32
ARRAY, MAP = 64, 128          # container headers; never part of a column's mask

# Columns of the statistics table filled by read_batch (one row per column of the batch).
(C_NAME, C_NAME_LEN, C_BASE, C_COUNT, C_MASK, C_INT_MIN, C_INT_MAX, C_FLAGS) = range(8)
N_STATS = 8
# Bits of C_FLAGS.
EMPTY_STR, CONTROL_CHAR, LONG_STR, OUT_OF_RANGE = 1, 2, 4, 8   # OUT_OF_RANGE: NaN, ±inf, > 1e15

# Where read_batch's header values say "absent".
ABSENT = -1
_INT64_MAX, _INT64_MIN = 2**63 - 1, -2**63
# Keys of the top-level map.
_KEY_BATCH = np.frombuffer(b"batch", dtype=np.uint8)
_KEY_KIND = np.frombuffer(b"kind", dtype=np.uint8)
_KEY_N = np.frombuffer(b"n", dtype=np.uint8)
_KEY_COLUMNS = np.frombuffer(b"columns", dtype=np.uint8)


@nb.njit(nogil=True, inline="always")
def _uint(data, pos, size):
    """Big-endian unsigned integer of ``size`` <= 8 bytes (the caller keeps it below 2^63)."""
    v = np.int64(0)
    for k in range(size):
        v = v * 256 + np.int64(data[pos + k])
    return v


@nb.njit(nogil=True, inline="always")
def _int(data, pos, size):
    """Big-endian two's complement integer of ``size`` <= 8 bytes."""
    v = np.int64(data[pos])
    if v >= 128:
        v -= 256
    for k in range(1, size):
        v = v * 256 + np.int64(data[pos + k])
    return v


@nb.njit(nogil=True, inline="always")
def _value(data, pos):
    """``(type, end, ival, fval)`` of the msgpack item at ``pos``.

    INT: ``ival`` is the value; FLOAT: ``fval``; STR: the bytes are ``data[end - ival:end]``
    (not yet checked as UTF-8); ARRAY / MAP: ``ival`` elements / pairs follow at ``end``;
    NIL, BIG (a uint64 of 2^63 or more): nothing more. OTHER with ``end == -1``: anything else,
    or data cut short.
    """
    n = data.shape[0]
    if pos >= n:
        return OTHER, -1, 0, 0.0
    b = np.int64(data[pos])
    if b <= 0x7F:
        return INT, pos + 1, b, 0.0
    if b >= 0xE0:
        return INT, pos + 1, b - 256, 0.0
    if b >= 0xA0 and b <= 0xBF:
        length = b & 0x1F
        end = pos + 1 + length
        return (STR, end, length, 0.0) if end <= n else (OTHER, -1, 0, 0.0)
    if b >= 0x90 and b <= 0x9F:
        return ARRAY, pos + 1, b & 0x0F, 0.0
    if b >= 0x80 and b <= 0x8F:
        return MAP, pos + 1, b & 0x0F, 0.0
    if b == 0xC0:
        return NIL, pos + 1, 0, 0.0
    size = 0      # bytes of the fixed-size payload (or of the length field)
    if b == 0xCA or b == 0xCE or b == 0xD2 or b == 0xDB or b == 0xDD or b == 0xDF:
        size = 4
    elif b == 0xCB or b == 0xCF or b == 0xD3:
        size = 8
    elif b == 0xCD or b == 0xD1 or b == 0xDA or b == 0xDC or b == 0xDE:
        size = 2
    elif b == 0xCC or b == 0xD0 or b == 0xD9:
        size = 1
    else:           # bool, bin, ext, the unused 0xC1
        return OTHER, -1, 0, 0.0
    end = pos + 1 + size
    if end > n:
        return OTHER, -1, 0, 0.0
    if b == 0xCA:
        single = np.uint32(_uint(data, pos + 1, 4))
        return FLOAT, end, 0, np.float64(single.view(np.float32))
    if b == 0xCB:
        double = np.int64(_int(data, pos + 1, 8))
        return FLOAT, end, 0, double.view(np.float64)
    if b == 0xCF:
        if data[pos + 1] >= 0x80:
            return BIG, end, 0, 0.0
        return INT, end, _uint(data, pos + 1, 8), 0.0
    if b >= 0xCC and b <= 0xCE:
        return INT, end, _uint(data, pos + 1, size), 0.0
    if b >= 0xD0 and b <= 0xD3:
        return INT, end, _int(data, pos + 1, size), 0.0
    length = _uint(data, pos + 1, size)
    if b >= 0xD9 and b <= 0xDB:
        if end + length > n:
            return OTHER, -1, 0, 0.0
        return STR, end + length, length, 0.0
    if b == 0xDC or b == 0xDD:
        return ARRAY, end, length, 0.0
    return MAP, end, length, 0.0


@nb.njit(nogil=True, inline="always")
def _utf8(data, start, end):
    """``(valid, characters, has_control)`` of ``data[start:end]`` as UTF-8; ``has_control``:
    a C0 control character or DEL (U+0000..U+001F, U+007F) occurs."""
    i = start
    chars = 0
    control = False
    while i < end:
        c = data[i]
        if c >= 0x20 and c < 0x7F:       # printable ASCII, the common case
            i += 1
            chars += 1
            continue
        if c < 0x80:                     # the rest of ASCII: C0 controls and DEL
            control = True
            i += 1
        elif c < 0xC2 or c > 0xF4:
            return False, chars, control
        elif c < 0xE0:
            if i + 1 >= end or (data[i + 1] & 0xC0) != 0x80:
                return False, chars, control
            i += 2
        elif c < 0xF0:
            if i + 2 >= end:
                return False, chars, control
            c1 = data[i + 1]
            low = 0xA0 if c == 0xE0 else 0x80
            high = 0x9F if c == 0xED else 0xBF
            if c1 < low or c1 > high or (data[i + 2] & 0xC0) != 0x80:
                return False, chars, control
            i += 3
        else:
            if i + 3 >= end:
                return False, chars, control
            c1 = data[i + 1]
            low = 0x90 if c == 0xF0 else 0x80
            high = 0x8F if c == 0xF4 else 0xBF
            if (c1 < low or c1 > high or (data[i + 2] & 0xC0) != 0x80
                    or (data[i + 3] & 0xC0) != 0x80):
                return False, chars, control
            i += 4
        chars += 1
    return True, chars, control


# Copies that are called rather than inlined, for the few items of a message's structure (its
# keys, the header values, the column names): inlining every call site of _value multiplies
# compile time, and only the per-value loops need it.
_item = nb.njit(nogil=True)(_value.py_func)
utf8_scan = nb.njit(cache=True, nogil=True)(_utf8.py_func)


@nb.njit(nogil=True)
def _is_key(data, start, length, key):
    if length != key.shape[0]:
        return False
    for k in range(length):
        if data[start + k] != key[k]:
            return False
    return True


@nb.njit(cache=True, nogil=True)
def read_batch(data, max_chars, stats, ints, floats, valid, chars, offsets):
    """Read a column batch ``{"batch": v, "kind": k, "n": n, "columns": {name: [...]}}`` in
    one pass, without building it: one row of ``stats`` (int64, ``N_STATS`` columns) per
    column, and every column's values copied into the flat outputs.

    Column ``c`` holding ``count`` values owns the slots ``base .. base + count - 1`` of the
    value outputs (``base = stats[c, C_BASE]``, the counts of the columns before it) and the
    ``count + 1`` slots from ``base + c`` of ``offsets``. Value ``i`` of it is, by its type:
    INT: ``ints[base + i]`` and, as a double, ``floats[base + i]``; FLOAT: ``floats``; STR:
    ``chars[offsets[base + c + i]:offsets[base + c + i + 1]]``; NIL: ``valid[base + i] == 0``
    (1 for every other value). Outputs need room for ``len(data)`` values (every value takes a
    byte), ``chars`` for ``len(data)`` bytes, ``offsets`` for ``len(data) + stats.shape[0]``.

    Returns ``(ok, version, n, kind_start, kind_length, n_columns)``. ``ok`` is False when the
    message is not a plain batch: not a map of string keys; a key repeated; "batch", "n" or
    "columns" absent; "batch" or "n" not a non-negative integer, "kind" not a string; another
    top-level value that is not a scalar; a column that is not an array of scalars; more
    columns than ``stats`` has rows; bytes after the map or data cut short; a string that is
    not UTF-8. A string value longer than ``max_chars`` characters sets LONG_STR.
    """
    code, pos, pairs, _ = _item(data, 0)
    if code != MAP:
        return False, ABSENT, ABSENT, ABSENT, ABSENT, ABSENT
    version = n = kind_start = kind_length = n_columns = ABSENT
    for _ in range(pairs):
        code, end, length, _ = _item(data, pos)
        if code != STR:
            return False, ABSENT, ABSENT, ABSENT, ABSENT, ABSENT
        start = end - length
        if not utf8_scan(data, start, end)[0]:
            return False, ABSENT, ABSENT, ABSENT, ABSENT, ABSENT
        pos = end
        code, end, ival, _ = _item(data, pos)
        if _is_key(data, start, length, _KEY_BATCH):
            if code != INT or version != ABSENT or ival < 0:
                return False, ABSENT, ABSENT, ABSENT, ABSENT, ABSENT
            version = ival
        elif _is_key(data, start, length, _KEY_N):
            if code != INT or n != ABSENT or ival < 0:
                return False, ABSENT, ABSENT, ABSENT, ABSENT, ABSENT
            n = ival
        elif _is_key(data, start, length, _KEY_KIND):
            if code != STR or kind_start != ABSENT or not utf8_scan(data, end - ival, end)[0]:
                return False, ABSENT, ABSENT, ABSENT, ABSENT, ABSENT
            kind_start, kind_length = end - ival, ival
        elif _is_key(data, start, length, _KEY_COLUMNS):
            if code != MAP or n_columns != ABSENT or ival > stats.shape[0]:
                return False, ABSENT, ABSENT, ABSENT, ABSENT, ABSENT
            n_columns = ival
            end = _read_columns(data, end, n_columns, max_chars, stats, ints, floats, valid,
                                chars, offsets)
        elif code == OTHER or code == ARRAY or code == MAP:
            return False, ABSENT, ABSENT, ABSENT, ABSENT, ABSENT
        elif code == STR and not utf8_scan(data, end - ival, end)[0]:
            return False, ABSENT, ABSENT, ABSENT, ABSENT, ABSENT
        if end < 0:
            return False, ABSENT, ABSENT, ABSENT, ABSENT, ABSENT
        pos = end
    if pos != data.shape[0] or version == ABSENT or n == ABSENT or n_columns == ABSENT:
        return False, ABSENT, ABSENT, ABSENT, ABSENT, ABSENT
    return True, version, n, kind_start, kind_length, n_columns


@nb.njit(nogil=True)
def _read_columns(data, pos, n_columns, max_chars, stats, ints, floats, valid, chars,
                  offsets):
    """The columns map at ``pos`` into ``stats[:n_columns]`` and the outputs (see
    :func:`read_batch`); returns the position after it, or -1 if the columns are not arrays
    of scalars."""
    base = 0
    at = 0                      # bytes of chars used
    for c in range(n_columns):
        code, end, length, _ = _item(data, pos)
        if code != STR or not utf8_scan(data, end - length, end)[0]:
            return -1
        stats[c, C_NAME] = end - length
        stats[c, C_NAME_LEN] = length
        code, pos, count, _ = _item(data, end)
        if code != ARRAY or count > data.shape[0] - pos:   # every value takes a byte
            return -1
        stats[c, C_BASE] = base
        stats[c, C_COUNT] = count
        mask = 0
        low = _INT64_MAX
        high = _INT64_MIN
        flags = 0
        slot = base + c
        offsets[slot] = at
        for i in range(base, base + count):
            code, end, ival, fval = _value(data, pos)
            mask |= code
            valid[i] = 1
            if code == INT:
                ints[i] = ival
                floats[i] = np.float64(ival)
                low = min(low, ival)
                high = max(high, ival)
            elif code == STR:
                start = end - ival
                k = 0                   # copy printable ASCII as it comes (the common case)
                while k < ival and data[start + k] >= 0x20 and data[start + k] < 0x7F:
                    chars[at + k] = data[start + k]
                    k += 1
                n_chars, control = k, False
                if k < ival:            # the rest: checked in full, then copied
                    ok, rest, control = _utf8(data, start + k, end)
                    if not ok:
                        return -1
                    n_chars += rest
                    for j in range(k, ival):
                        chars[at + j] = data[start + j]
                at += ival
                if ival == 0:
                    flags |= EMPTY_STR
                if control:
                    flags |= CONTROL_CHAR
                if n_chars > max_chars:
                    flags |= LONG_STR
            elif code == FLOAT:
                floats[i] = fval
                if not abs(fval) <= MAX_ABS_NUMBER:
                    flags |= OUT_OF_RANGE
            elif code == NIL:
                valid[i] = 0
            elif code != BIG:   # OTHER, ARRAY, MAP
                return -1
            slot += 1
            offsets[slot] = at
            pos = end
        base += count
        stats[c, C_MASK] = mask
        stats[c, C_INT_MIN] = low
        stats[c, C_INT_MAX] = high
        stats[c, C_FLAGS] = flags
    return pos


_POWERS_OF_TEN = np.array([10**k for k in range(1, 20)], dtype=np.uint64)


@nb.njit(nogil=True, inline="always", error_model="numpy")
def _write_int(chars, at, v):
    """Write the decimal text of int64 ``v`` (what ``str(int)`` gives) at ``chars[at:]``;
    returns the position after it (at most 20 characters: "-9223372036854775808")."""
    if v < 0:
        chars[at] = 45                            # "-"
        at += 1
        magnitude = np.uint64(-(v + 1)) + np.uint64(1)    # |v|, also for -2^63
    else:
        magnitude = np.uint64(v)
    digits = 1
    while digits < 20 and magnitude >= _POWERS_OF_TEN[digits - 1]:
        digits += 1
    ten = np.uint64(10)
    for k in range(at + digits - 1, at - 1, -1):
        chars[k] = 48 + magnitude % ten
        magnitude //= ten
    return at + digits


@nb.njit(cache=True, nogil=True, error_model="numpy")
def int_text(values):
    """Decimal text of int64 ``values`` (what ``str(int)`` gives) as an Arrow string layout
    ``(offsets int32, chars uint8)``."""
    n = values.shape[0]
    offsets = np.empty(n + 1, np.int32)
    chars = np.empty(n * 20, np.uint8)
    at = 0
    offsets[0] = 0
    for i in range(n):
        at = _write_int(chars, at, values[i])
        offsets[i + 1] = at
    return offsets, chars[:at]


# What append_rows does with a stored field (column P_WHAT of its plan).
STR_FROM_STR, STR_FROM_INT, NULL_STR, INT64, FLOAT64 = range(5)
P_WHAT, P_SLOT, P_BASE, P_COLUMN = range(4)
N_PLAN = 4


@nb.njit(cache=True, nogil=True, error_model="numpy")
def append_rows(plan, n, ints, floats, valid, chars, offsets, row, acc_ints, acc_floats,
                acc_lengths, acc_valid, acc_chars, used, used_after):
    """Append the ``n`` values of each planned field of one batch, as read by
    :func:`read_batch` into ``ints, floats, valid, chars, offsets``, at row ``row`` of the
    accumulated columns of its kind.

    ``plan``: one row per stored field: what to do (STR_FROM_STR: copy strings; STR_FROM_INT:
    write integers as decimal text; NULL_STR: null strings, for an absent optional field;
    INT64, FLOAT64: copy numbers), the field's slot among the accumulated columns of its type,
    and where its values are (``base``, ``column``: see :func:`read_batch`). String slot ``s``
    accumulates value lengths in ``acc_lengths[s]``, validity in ``acc_valid[s]`` and the bytes
    in ``acc_chars[s, used[s]:]``; ``used_after[s]`` receives the bytes used after this batch
    (the caller commits it, and the rows, once this returns). The caller makes room first:
    ``row + n`` rows, and per string slot the batch's bytes (20 per value from integers).
    """
    for f in range(plan.shape[0]):
        what, slot = plan[f, P_WHAT], plan[f, P_SLOT]
        base, column = plan[f, P_BASE], plan[f, P_COLUMN]
        if what == INT64:
            acc_ints[slot, row:row + n] = ints[base:base + n]
        elif what == FLOAT64:
            acc_floats[slot, row:row + n] = floats[base:base + n]
        elif what == NULL_STR:
            acc_lengths[slot, row:row + n] = 0
            acc_valid[slot, row:row + n] = 0
            used_after[slot] = used[slot]
        elif what == STR_FROM_INT:
            at = used[slot]
            out, lengths = acc_chars[slot], acc_lengths[slot]
            for i in range(n):
                end = _write_int(out, at, ints[base + i])
                lengths[row + i] = end - at
                at = end
            acc_valid[slot, row:row + n] = 1
            used_after[slot] = at
        else:                                     # STR_FROM_STR
            at = used[slot]
            out, lengths = acc_chars[slot], acc_lengths[slot]
            first = base + column
            start = offsets[first]
            for i in range(n):
                lengths[row + i] = offsets[first + i + 1] - offsets[first + i]
            end = offsets[first + n]
            out[at:at + end - start] = chars[start:end]    # the column's strings are contiguous
            acc_valid[slot, row:row + n] = valid[base:base + n]
            used_after[slot] = at + end - start


@nb.njit(cache=True, nogil=True)
def equal_strings(offsets_a, chars_a, offsets_b, chars_b):
    """Indices ``i`` where string ``i`` of two Arrow string layouts is the same."""
    n = offsets_a.shape[0] - 1
    same = np.zeros(n, np.bool_)
    for i in range(n):
        a0, a1 = offsets_a[i], offsets_a[i + 1]
        b0, b1 = offsets_b[i], offsets_b[i + 1]
        if a1 - a0 != b1 - b0:
            continue
        equal = True
        for k in range(a1 - a0):
            if chars_a[a0 + k] != chars_b[b0 + k]:
                equal = False
                break
        same[i] = equal
    return np.flatnonzero(same)
