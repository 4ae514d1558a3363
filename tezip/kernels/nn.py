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
    (zero padding; ``xp`` is the padded input from ``pad1``)."""
    Cin = xp.shape[0]
    Cout, H, W = out.shape
    for y in range(H):
        for co in range(Cout):
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
