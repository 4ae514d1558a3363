"""Neural-network inference for the learned forecaster, in float32, reproducible bit for
bit on every machine: only IEEE additions, multiplications and comparisons, each output
value accumulated in a fixed order (bias, then input channel, kernel row, kernel column),
vectorized across pixels (every SIMD lane runs one pixel's sequence, so the result does
not depend on the vector width), no fused multiply-add (numba emits none), no libm
(activations are piecewise linear).

Tensors are (channels, height, width) float32, C-contiguous.
"""

from __future__ import annotations

import numpy as np

from .core import jit

_SIXTH = np.float32(1.0 / 6.0)


@jit
def pad1(x, xp):
    """Zero-pad (C, H, W) by one pixel on each side into xp (C, H+2, W+2)."""
    C, H, W = x.shape
    for c in range(C):
        for xx in range(W + 2):
            xp[c, 0, xx] = 0.0
            xp[c, H + 1, xx] = 0.0
        for y in range(H):
            xp[c, y + 1, 0] = 0.0
            xp[c, y + 1, W + 1] = 0.0
            for xx in range(W):
                xp[c, y + 1, xx + 1] = x[c, y, xx]


@jit
def conv3x3(xp, w, b, out):
    """out[co] = b[co] + sum over ci, ky, kx of w[co, ci, ky, kx] * x[ci, y+ky-1, x+kx-1]
    (zero padding; ``xp`` is the padded input from ``pad1``). Four output channels at a
    time share each input row's loads (1.3-1.9x the speed of one at a time on the shipped
    model's gates; every output's sums in the same order, so the same bits)."""
    Cin = xp.shape[0]
    Cout, H, W = out.shape
    for y in range(H):
        co = 0
        while co + 4 <= Cout:
            a0 = out[co, y]
            a1 = out[co + 1, y]
            a2 = out[co + 2, y]
            a3 = out[co + 3, y]
            b0 = b[co]
            b1 = b[co + 1]
            b2 = b[co + 2]
            b3 = b[co + 3]
            for xx in range(W):
                a0[xx] = b0
                a1[xx] = b1
                a2[xx] = b2
                a3[xx] = b3
            for ci in range(Cin):
                for ky in range(3):
                    row = xp[ci, y + ky]
                    w00, w01, w02 = w[co, ci, ky, 0], w[co, ci, ky, 1], w[co, ci, ky, 2]
                    w10, w11, w12 = w[co + 1, ci, ky, 0], w[co + 1, ci, ky, 1], w[co + 1, ci, ky, 2]
                    w20, w21, w22 = w[co + 2, ci, ky, 0], w[co + 2, ci, ky, 1], w[co + 2, ci, ky, 2]
                    w30, w31, w32 = w[co + 3, ci, ky, 0], w[co + 3, ci, ky, 1], w[co + 3, ci, ky, 2]
                    for xx in range(W):
                        r0 = row[xx]
                        r1 = row[xx + 1]
                        r2 = row[xx + 2]
                        a0[xx] = a0[xx] + w00 * r0 + w01 * r1 + w02 * r2
                        a1[xx] = a1[xx] + w10 * r0 + w11 * r1 + w12 * r2
                        a2[xx] = a2[xx] + w20 * r0 + w21 * r1 + w22 * r2
                        a3[xx] = a3[xx] + w30 * r0 + w31 * r1 + w32 * r2
            co += 4
        while co < Cout:
            acc = out[co, y]
            bias = b[co]
            for xx in range(W):
                acc[xx] = bias
            for ci in range(Cin):
                for ky in range(3):
                    row = xp[ci, y + ky]
                    w0 = w[co, ci, ky, 0]
                    w1 = w[co, ci, ky, 1]
                    w2 = w[co, ci, ky, 2]
                    for xx in range(W):
                        acc[xx] = acc[xx] + w0 * row[xx] + w1 * row[xx + 1] + w2 * row[xx + 2]
            co += 1


@jit
def conv1x1(x, w, b, out):
    """out[co] = b[co] + sum over ci of w[co, ci, 0, 0] * x[ci]."""
    Cin = x.shape[0]
    Cout, H, W = out.shape
    for y in range(H):
        for co in range(Cout):
            acc = out[co, y]
            bias = b[co]
            for xx in range(W):
                acc[xx] = bias
            for ci in range(Cin):
                row = x[ci, y]
                wv = w[co, ci, 0, 0]
                for xx in range(W):
                    acc[xx] = acc[xx] + wv * row[xx]


@jit
def relu_(x):
    f = x.reshape(-1)
    for i in range(f.size):
        v = f[i]
        f[i] = v if v > 0.0 else np.float32(0.0)


@jit
def lstm_(g, c, r):
    """ConvLSTM update from pre-activations ``g`` (4h, H, W): input, forget and output
    gates hardsigmoid(x) = clamp(x/6 + 1/2, 0, 1), candidate hardtanh(x) = clamp(x, -1, 1);
    c = f * c + i * g; r = o * hardtanh(c). In place on c and r."""
    h = c.shape[0]
    gf = g.reshape(4, -1)
    cf = c.reshape(-1)
    rf = r.reshape(-1)
    one = np.float32(1.0)
    zero = np.float32(0.0)
    half = np.float32(0.5)
    for i in range(cf.size):
        gi = gf[0, i] * _SIXTH + half
        gi = zero if gi < zero else (one if gi > one else gi)
        gfo = gf[1, i] * _SIXTH + half
        gfo = zero if gfo < zero else (one if gfo > one else gfo)
        gc = gf[2, i]
        gc = -one if gc < -one else (one if gc > one else gc)
        go = gf[3, i] * _SIXTH + half
        go = zero if go < zero else (one if go > one else go)
        cv = gfo * cf[i] + gi * gc
        cf[i] = cv
        ct = -one if cv < -one else (one if cv > one else cv)
        rf[i] = go * ct
    _ = h


@jit
def error_units(a, ahat, e):
    """E = [relu(a - ahat), relu(ahat - a)] over channels: e is (2C, H, W)."""
    C = a.shape[0]
    af = a.reshape(C, -1)
    hf = ahat.reshape(C, -1)
    ef = e.reshape(2 * C, -1)
    zero = np.float32(0.0)
    for c in range(C):
        for i in range(af.shape[1]):
            d = af[c, i] - hf[c, i]
            ef[c, i] = d if d > zero else zero
            ef[C + c, i] = -d if d < zero else zero


@jit
def maxpool2(x, out):
    """2x2 max pooling (odd sizes: the last row/column pools what there is)."""
    C, H, W = x.shape
    _, h, w = out.shape
    for c in range(C):
        for y in range(h):
            for xx in range(w):
                m = x[c, 2 * y, 2 * xx]
                if 2 * xx + 1 < W and x[c, 2 * y, 2 * xx + 1] > m:
                    m = x[c, 2 * y, 2 * xx + 1]
                if 2 * y + 1 < H:
                    if x[c, 2 * y + 1, 2 * xx] > m:
                        m = x[c, 2 * y + 1, 2 * xx]
                    if 2 * xx + 1 < W and x[c, 2 * y + 1, 2 * xx + 1] > m:
                        m = x[c, 2 * y + 1, 2 * xx + 1]
                out[c, y, xx] = m


@jit
def upsample2(x, out):
    """Nearest-neighbour 2x upsampling into ``out`` (C, H, W) with H <= 2h, W <= 2w."""
    C, H, W = out.shape
    for c in range(C):
        for y in range(H):
            for xx in range(W):
                out[c, y, xx] = x[c, y >> 1, xx >> 1]


# --- the forecaster's frame steps (``learned.runtime``, ``predictors.learned``) ------------
# (one pass each instead of numpy's several over temporaries; the same IEEE operations
# in the same order, so the same bits)

@jit
def normalize(x, lo, scale, lo_clip, hi_clip, prev, out):
    """``out`` (float32, (C, H, W)) = ``(x - lo) / scale`` clipped to [lo_clip,
    hi_clip] where finite, else ``prev``; ``x`` (C, H, W), any real dtype and layout,
    taken as float64."""
    C, H, W = out.shape
    for c in range(C):
        for y in range(H):
            for xx in range(W):
                v = (np.float64(x[c, y, xx]) - lo) / scale
                if abs(v) < np.inf:
                    v = hi_clip if v > hi_clip else (lo_clip if v < lo_clip else v)
                    out[c, y, xx] = np.float32(v)
                else:
                    out[c, y, xx] = prev[c, y, xx]


@jit
def snap(f, unit, k, out):
    """A forecast ``f`` (float64, flat) on the grid of ``unit``: ``k`` (int64) the grid
    index of each value (0 past +-2^52, or not finite), ``out`` = k * unit."""
    lim = 2.0 ** 52
    for i in range(f.size):
        q = np.rint(f[i] / unit)
        if not abs(q) <= lim:
            q = 0.0
        k[i] = np.int64(q)
        out[i] = q * unit
