"""Bit-exact coding of floats: each value's IEEE bit pattern mapped to an integer that
follows the float order (``quantize._ordered_bits``), predicted from neighbours with
integer arithmetic modulo 2^64 (so every pattern, NaN payloads and -0.0 included, comes
back exactly) and the residual coded.

Predictors (``kind``): 0 the previous frame (2-D Lorenzo on the first), 1 2-D Lorenzo,
2 3-D Lorenzo. Contexts: group (first frame / others) x mean bit length of the
neighbours' residuals.
"""

from __future__ import annotations

import numpy as np

from .core import (
    ALPHABET,
    ESC,
    NB,
    M,
    bit_length,
    bits_at,
    escape_high,
    inline,
    jit,
    rans_next,
)

N_CTX = 2 * NB
GROUPS = np.array([NB], np.int64)


@inline
def _pred(qf, i, t, y, xx, HW, W, kind):
    """Prediction (uint64, modulo 2^64) of point i from earlier points."""
    zero = np.uint64(0)
    if kind == 0 and t > 0:
        return qf[np.uint64(i - HW)]
    a = qf[np.uint64(i - 1)] if xx > 0 else zero
    b = qf[np.uint64(i - W)] if y > 0 else zero
    c = qf[np.uint64(i - W - 1)] if (xx > 0 and y > 0) else zero
    p = a + b - c
    if kind == 2 and t > 0:
        j = i - HW
        d = qf[np.uint64(j)]
        e = qf[np.uint64(j - 1)] if xx > 0 else zero
        f = qf[np.uint64(j - W)] if y > 0 else zero
        g = qf[np.uint64(j - W - 1)] if (xx > 0 and y > 0) else zero
        p = p + d - e - f + g
    return p


@inline
def _ctx(act, i, t, y, xx, HW, W):
    s = 0
    m = 0
    if xx > 0:
        s += np.int64(act[np.uint64(i - 1)])
        m += 1
    if y > 0:
        s += np.int64(act[np.uint64(i - W)])
        m += 1
    g = 1 if t == 0 else 0
    b = (s + m // 2) // m if m else 0
    return g * NB + (b if b < NB else NB - 1)


@jit
def encode(q, kind, act, codes, ctx):
    """q: ordered-bit integers (uint64, any shape (T, H, W)); writes int64 residual codes
    and contexts in raster order."""
    T, H, W = q.shape
    qf = q.ravel()
    af = act.ravel()
    HW = H * W
    n = 0
    for t in range(T):
        for y in range(H):
            for xx in range(W):
                i = t * HW + y * W + xx
                r = qf[np.uint64(i)] - _pred(qf, i, t, y, xx, HW, W, kind)
                ctx[n] = _ctx(af, i, t, y, xx, HW, W)
                k = np.int64(r)
                codes[n] = k
                z = np.uint64((k << 1) ^ (k >> 63))
                bl = bit_length(z)
                af[np.uint64(i)] = bl
                n += 1
    return n


@jit
def decode(q, kind, act, cmap, kbs, lut, fc, words, lw, st):
    """Inverse of ``encode`` (decoder state in ``st`` as in ``interp.decode``)."""
    T, H, W = q.shape
    qf = q.ravel()
    af = act.ravel()
    HW = H * W
    x0 = st[0]
    x1 = st[1]
    wp = st[2]
    bpos = st[3]
    nw1 = words.size - 1
    nlw = lw.size - 2
    for t in range(T):
        for y in range(H):
            for xx in range(W):
                i = t * HW + y * W + xx
                c = np.int64(cmap[_ctx(af, i, t, y, xx, HW, W)])
                slot = x0 & (M - 1)
                sym = np.int64(lut[np.uint64(c * M + slot)])
                x0, x1, wp = rans_next(x0, x1, slot, fc[np.uint64(c * ALPHABET + sym)],
                                       np.int64(words[np.uint64(wp if wp < nw1 else nw1)]), wp)
                hv = np.uint64(sym)
                if sym >= ESC:
                    hv, bpos = escape_high(lw, bpos)
                kb = kbs[np.uint64(c)]
                z = hv << np.uint64(kb)
                if kb:
                    w = bpos >> 6
                    w = w if w < nlw else nlw
                    lo, bpos = bits_at(lw[np.uint64(w)], lw[np.uint64(w + 1)], bpos, kb)
                    z |= lo
                r = (z >> np.uint64(1)) ^ (np.uint64(0) - (z & np.uint64(1)))
                qf[np.uint64(i)] = _pred(qf, i, t, y, xx, HW, W, kind) + r
                af[np.uint64(i)] = bit_length(z)
    st[0] = x0
    st[1] = x1
    st[2] = wp
    st[3] = bpos
