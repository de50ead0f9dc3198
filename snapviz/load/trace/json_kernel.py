"""Numba kernels for the JSON grammar, byte by byte (the ``fast`` extra): whitespace, strings
(strict UTF-8, escapes), numbers, literals and whole values with their nesting. Each says
where a token ends, or -1 where the text is not JSON that every parser here (msgspec,
orjson, the stdlib) reads alike; callers give such input back to those parsers.

This module imports numba at import time: import it only when a kernel is wanted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numba.extending import register_jitable

from snapviz.compiled import njit_cached

MAX_DIGITS = 18  # significant digits kept exactly in an int64 mantissa


def jit(fn: Callable[..., Any]) -> Any:
    """``fn`` compiled (cached on disk); ImportError without numba, so importers see it."""
    compiled = njit_cached(fn)
    if compiled is None:
        raise ImportError("numba is not installed")
    return compiled


# The helpers below are compiled inside their caller's kernel (one compiled unit, one
# cache entry to load: about 0.4 s less than a cached kernel per helper), and stay plain
# Python functions when called from Python.
inline = register_jitable


@inline
def eq(b: np.ndarray, s: int, e: int, lit: np.ndarray) -> bool:
    if e - s != len(lit):
        return False
    for k in range(len(lit)):
        if b[s + k] != lit[k]:
            return False
    return True


@inline
def ws(b: np.ndarray, i: int, n: int) -> int:
    while i < n:
        c = b[i]
        if c != 32 and c != 10 and c != 13 and c != 9:
            return i
        i += 1
    return i


@inline
def hex_digit(c: int) -> int:
    if 48 <= c <= 57:
        return c - 48
    if 97 <= c <= 102:
        return c - 87
    if 65 <= c <= 70:
        return c - 55
    return -1


@inline
def utf8_end(b: np.ndarray, i: int, n: int) -> int:
    """End of the strict UTF-8 sequence starting at ``i`` (a byte >= 0x80), or -1."""
    c = b[i]
    lo, hi = 0x80, 0xBF
    if 0xC2 <= c <= 0xDF:
        k = 1
    elif c == 0xE0:
        k, lo = 2, 0xA0
    elif 0xE1 <= c <= 0xEC or c == 0xEE or c == 0xEF:
        k = 2
    elif c == 0xED:  # no encoded surrogates
        k, hi = 2, 0x9F
    elif c == 0xF0:
        k, lo = 3, 0x90
    elif 0xF1 <= c <= 0xF3:
        k = 3
    elif c == 0xF4:
        k, hi = 3, 0x8F
    else:
        return -1
    if i + k >= n or b[i + 1] < lo or b[i + 1] > hi:
        return -1
    for j in range(2, k + 1):
        if b[i + j] < 0x80 or b[i + j] > 0xBF:
            return -1
    return i + k + 1


@inline
def string_end(b: np.ndarray, i: int, n: int) -> tuple[int, int]:
    """(end after the closing quote, 1 if it holds escapes) of the string opening at ``i``;
    end -1 where the text is not a string every parser here reads alike."""
    i += 1
    esc = 0
    while i < n:
        c = b[i]
        if c >= 35 and c != 92 and c < 128:  # most bytes: printable ASCII text, one test
            i += 1
            continue
        if c == 34:
            return i + 1, esc
        if c == 92:
            esc = 1
            if i + 1 >= n:
                return -1, 0
            e = b[i + 1]
            if e == 117:  # \uXXXX, surrogates left to the reference
                if i + 5 >= n:
                    return -1, 0
                v = 0
                for k in range(2, 6):
                    h = hex_digit(b[i + k])
                    if h < 0:
                        return -1, 0
                    v = v * 16 + h
                if 0xD800 <= v <= 0xDFFF:
                    return -1, 0
                i += 6
            elif e == 34 or e == 92 or e == 47 or e == 98 or e == 102 or e == 110 or e == 114 or e == 116:
                i += 2
            else:
                return -1, 0
        elif c < 32:
            return -1, 0
        elif c < 128:
            i += 1
        else:
            i = utf8_end(b, i, n)
            if i < 0:
                return -1, 0
    return -1, 0


@inline
def number(b: np.ndarray, i: int, n: int) -> tuple[int, int, int, int, int]:
    """(end, is_integer, sign, mantissa, exponent) of the number at ``i``: the value is
    sign * mantissa * 10**exponent, and the mantissa -1 where it has over 18 significant
    digits. End -1 if it is not JSON, -2 if its magnitude is beyond 1e+-300 (left to the
    reference: parsers differ there)."""
    neg = 0
    if i < n and b[i] == 45:
        neg = 1
        i += 1
    if i >= n or b[i] < 48 or b[i] > 57:
        return -1, 0, 0, 0, 0
    m = 0
    nd = 0  # significant digits so far
    exp = 0
    big = False
    if b[i] == 48:
        i += 1
    else:
        while i < n and 48 <= b[i] <= 57:
            if nd < MAX_DIGITS:
                m = m * 10 + (b[i] - 48)
            else:
                big = True
                exp += 1  # a dropped digit: the exponent keeps the magnitude for the range test
            nd += 1
            i += 1
    is_int = 1
    if i < n and b[i] == 46:
        is_int = 0
        i += 1
        if i >= n or b[i] < 48 or b[i] > 57:
            return -1, 0, 0, 0, 0
        while i < n and 48 <= b[i] <= 57:
            d = b[i] - 48
            if nd == 0 and d == 0:
                exp -= 1  # a leading zero: not significant
            elif nd < MAX_DIGITS:
                m = m * 10 + d
                nd += 1
                exp -= 1
            else:
                big = big or d != 0  # trailing zeros beyond 18 digits change nothing
            i += 1
    if i < n and (b[i] == 101 or b[i] == 69):
        is_int = 0
        i += 1
        eneg = False
        if i < n and (b[i] == 43 or b[i] == 45):
            eneg = b[i] == 45
            i += 1
        if i >= n or b[i] < 48 or b[i] > 57:
            return -1, 0, 0, 0, 0
        e = 0
        while i < n and 48 <= b[i] <= 57:
            if e < 100000:
                e = e * 10 + (b[i] - 48)
            i += 1
        exp += -e if eneg else e
    if exp > 300 or exp < -300:
        return -2, 0, 0, 0, 0
    if big:  # over 18 significant digits: the value is for the caller to read from the text
        m = -1
    return i, is_int, neg, m, exp


@inline
def number_end(b: np.ndarray, i: int, n: int) -> int:
    """End of the number at ``i`` (-1: none the kernel reads), as :func:`number` says, without
    computing its value: integers and decimals are checked digit by digit, and only a
    number with an exponent goes through :func:`number` (for its magnitude)."""
    j = i + 1 if b[i] == 45 else i
    if j >= n or b[j] < 48 or b[j] > 57:
        return -1
    if b[j] == 48:
        j += 1
    else:
        while j < n and 48 <= b[j] <= 57:
            j += 1
    if j < n and b[j] == 46:
        j += 1
        if j >= n or b[j] < 48 or b[j] > 57:
            return -1
        while j < n and 48 <= b[j] <= 57:
            j += 1
    if j < n and (b[j] == 101 or b[j] == 69):
        end = number(b, i, n)[0]
        return end if end >= 0 else -1
    return j


@inline
def scalar_end(b: np.ndarray, i: int, n: int) -> int:
    """End of the string, number or literal at ``i`` (-1: none the kernel reads)."""
    c = b[i]
    if c == 34:
        return string_end(b, i, n)[0]
    if c == 45 or 48 <= c <= 57:
        return number_end(b, i, n)
    if c == 116 and i + 4 <= n and b[i + 1] == 114 and b[i + 2] == 117 and b[i + 3] == 101:
        return i + 4
    if c == 102 and i + 5 <= n and b[i + 1] == 97 and b[i + 2] == 108 and b[i + 3] == 115 and b[i + 4] == 101:
        return i + 5
    if c == 110 and i + 4 <= n and b[i + 1] == 117 and b[i + 2] == 108 and b[i + 3] == 108:
        return i + 4
    return -1


@inline
def value_end(b: np.ndarray, i: int, n: int, stack: np.ndarray, opens: np.ndarray, base: int) -> int:
    """End of the JSON value at ``i`` (no leading whitespace), validated; -1 where the
    kernel gives up (invalid, or nested deeper than ``stack``). Each container opening at
    or after ``base`` adds one to ``opens[0]`` (the values the stream guard counts)."""
    c = b[i]
    if c != 91 and c != 123:
        return scalar_end(b, i, n)
    if i >= base:
        opens[0] += 1
    stack[0] = c
    depth = 1
    i += 1
    state = 0  # 0: just opened, 1: after a comma, 2: after a value
    while True:
        i = ws(b, i, n)
        if i >= n:
            return -1
        c = b[i]
        top = stack[depth - 1]
        if state == 2:
            if c == 44:
                state = 1
                i += 1
                continue
            if c == top + 2:  # '[' + 2 == ']', '{' + 2 == '}'
                depth -= 1
                i += 1
                if depth == 0:
                    return i
                continue
            return -1
        if state == 0 and c == top + 2:
            depth -= 1
            i += 1
            if depth == 0:
                return i
            state = 2
            continue
        if top == 123:  # a key, then a colon
            if c != 34:
                return -1
            i = string_end(b, i, n)[0]
            if i < 0:
                return -1
            i = ws(b, i, n)
            if i >= n or b[i] != 58:
                return -1
            i = ws(b, i + 1, n)
            if i >= n:
                return -1
            c = b[i]
        if c == 91 or c == 123:
            if depth == len(stack):
                return -1
            if i >= base:
                opens[0] += 1
            stack[depth] = c
            depth += 1
            i += 1
            state = 0
            continue
        i = scalar_end(b, i, n)
        if i < 0:
            return -1
        state = 2


@inline
def unescaped_eq(b: np.ndarray, s: int, e: int, lit: np.ndarray) -> bool:
    """Whether the string text ``b[s:e]`` (escapes checked by :func:`string_end`) reads
    ``lit``, an ASCII text, once its escapes are decoded."""
    k = 0
    j = s
    while j < e:
        c = b[j]
        v = c
        j += 1
        if c == 92:
            x = b[j]
            j += 1
            if x == 117:
                v = 0
                for _ in range(4):
                    v = v * 16 + hex_digit(b[j])
                    j += 1
            elif x == 98:
                v = 8
            elif x == 102:
                v = 12
            elif x == 110:
                v = 10
            elif x == 114:
                v = 13
            elif x == 116:
                v = 9
            else:  # '"', '\\', '/'
                v = x
        if k >= len(lit) or v != lit[k]:
            return False
        k += 1
    return k == len(lit)
