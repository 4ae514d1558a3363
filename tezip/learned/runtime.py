"""The forecaster at work inside the codec: compiled float32 inference (``kernels.nn``),
one ``Forecaster`` per window (its state is the window's; models are shared read-only,
so any number of threads may run windows at once).

Values are normalized with the window's reconstructed keyframe, which the decoder has
too: v = (x - lo) / scale over the keyframe's finite values, clipped to [-8, 9]; a
non-finite value (an exact outlier) takes the previous frame's normalized value.
"""

from __future__ import annotations

import numpy as np

from ..kernels import nn
from .model import Model

_CLIP = (-8.0, 9.0)
_NORM_TYPES = (np.dtype(np.float32), np.dtype(np.float64))  # (others: as float64)


def _to_chw(frame: np.ndarray) -> np.ndarray:
    return frame[None] if frame.ndim == 2 else np.moveaxis(frame, -1, 0)


class Forecaster:
    """Forecasts frame t of a window from the reconstructed frames before it:
    ``start(keyframe)``, then per frame ``forecast()`` and ``observe(frame)``."""

    def __init__(self, model: Model, frame_shape: tuple[int, ...]) -> None:
        cfg = model.config
        self.cfg = cfg
        self.p = model.params
        self.gray = len(frame_shape) == 2
        C = 1 if self.gray else frame_shape[2]
        if cfg.channels != C:
            raise ValueError(f"model forecasts {cfg.channels}-channel frames, data have {C}")
        H, W = frame_shape[:2]
        self.sizes = [(H, W)]
        for _ in range(1, cfg.depth):
            h, w = self.sizes[-1]
            self.sizes.append(((h + 1) // 2, (w + 1) // 2))
        f32 = np.float32
        self.r = [np.zeros((hd, *self.sizes[i]), f32) for i, hd in enumerate(cfg.hidden)]
        self.c = [np.zeros_like(r) for r in self.r]
        self.e = [np.zeros((cfg.e_channels(i), *self.sizes[i]), f32) for i in range(cfg.depth)]
        # padded gate inputs, concatenated in the order [E, up(R_{l+1}), inputs, R]
        self.xp = [np.zeros((cfg.cell_inputs(i), h + 2, w + 2), f32)
                   for i, (h, w) in enumerate(self.sizes)]
        self.gates = [np.empty((4 * hd, *self.sizes[i]), f32) for i, hd in enumerate(cfg.hidden)]
        self.rp = [np.zeros((hd, h + 2, w + 2), f32)
                   for hd, (h, w) in zip(cfg.hidden, self.sizes, strict=True)]
        self.ahat0 = np.empty((C, H, W), f32)
        self.up = [np.empty((cfg.hidden[i + 1], *self.sizes[i]), f32) for i in range(cfg.depth - 1)]
        self.ep = [np.zeros((cfg.e_channels(i), h + 2, w + 2), f32)
                   for i, (h, w) in enumerate(self.sizes[:-1])]
        self.a_full = [np.empty((cfg.a_channels[i], *self.sizes[i]), f32)
                       for i in range(cfg.depth - 1)]
        self.a = [np.empty((cfg.a_channels[i], *self.sizes[i + 1]), f32)
                  for i in range(cfg.depth - 1)]
        self.ahat = [np.empty((cfg.a_channels[i], *self.sizes[i + 1]), f32)
                     for i in range(cfg.depth - 1)]
        self.prev = np.zeros((C, H, W), f32)
        self.prev2 = np.zeros((C, H, W), f32)
        self.fc = np.zeros((C, H, W), f32)
        self.lo, self.scale = 0.0, 1.0

    # -- values <-> normalized ----------------------------------------------------------
    def _norm(self, frame: np.ndarray) -> np.ndarray:
        x = _to_chw(np.asarray(frame))
        if x.dtype not in _NORM_TYPES:
            x = x.astype(np.float64)
        v = np.empty(self.prev.shape, np.float32)
        nn.normalize(x, self.lo, self.scale, _CLIP[0], _CLIP[1], self.prev, v)
        return v

    def start(self, keyframe: np.ndarray) -> None:
        k = np.asarray(keyframe, np.float64)
        fin = k[np.isfinite(k)]
        if fin.size:
            lo, hi = float(fin.min()), float(fin.max())
            self.lo, self.scale = lo, (hi - lo) if hi > lo else 1.0
        a = self._norm(keyframe)
        self.prev[...] = a
        self.prev2[...] = a

    # -- one step -----------------------------------------------------------------------
    def forecast(self) -> np.ndarray:
        """The forecast of the next frame, in data units (float64, frame shape)."""
        cfg, p = self.cfg, self.p
        for layer in reversed(range(cfg.depth)):
            h, w = self.sizes[layer]
            xp = self.xp[layer]
            k = 0
            e = self.e[layer]
            xp[k:k + e.shape[0], 1:h + 1, 1:w + 1] = e
            k += e.shape[0]
            if layer + 1 < cfg.depth:
                up = self.up[layer]
                nn.upsample2(self.r[layer + 1], up)
                xp[k:k + up.shape[0], 1:h + 1, 1:w + 1] = up
                k += up.shape[0]
            if layer == 0:
                C = self.prev.shape[0]
                for name in cfg.inputs:
                    src = self.prev if name == "prev" else self.prev - self.prev2
                    xp[k:k + C, 1:h + 1, 1:w + 1] = src
                    k += C
            r = self.r[layer]
            xp[k:k + r.shape[0], 1:h + 1, 1:w + 1] = r
            nn.conv3x3(xp, p[f"cell{layer}.weight"], p[f"cell{layer}.bias"], self.gates[layer])
            nn.lstm_(self.gates[layer], self.c[layer], r)
        h, w = self.sizes[0]
        rp = self.rp[0]
        rp[:, 1:h + 1, 1:w + 1] = self.r[0]
        nn.conv3x3(rp, p["ahat0.weight"], p["ahat0.bias"], self.ahat0)
        np.add(self.prev, self.ahat0, out=self.fc)
        out = self.lo + self.scale * self.fc.astype(np.float64)
        return out[0] if self.gray else np.moveaxis(out, 0, -1)

    def observe(self, frame: np.ndarray) -> None:
        """The reconstructed frame that was forecast: error units, upper layers."""
        cfg, p = self.cfg, self.p
        a = self._norm(frame)
        nn.error_units(a, self.fc, self.e[0])
        for layer in range(1, cfg.depth):
            h, w = self.sizes[layer - 1]
            ep = self.ep[layer - 1]
            ep[:, 1:h + 1, 1:w + 1] = self.e[layer - 1]
            full = self.a_full[layer - 1]
            nn.conv3x3(ep, p[f"aup{layer - 1}.weight"], p[f"aup{layer - 1}.bias"], full)
            nn.relu_(full)
            nn.maxpool2(full, self.a[layer - 1])
            hh, ww = self.sizes[layer]
            rp = self.rp[layer]
            rp[:, 1:hh + 1, 1:ww + 1] = self.r[layer]
            ahat = self.ahat[layer - 1]
            nn.conv3x3(rp, p[f"ahat{layer}.weight"], p[f"ahat{layer}.bias"], ahat)
            nn.relu_(ahat)
            nn.error_units(self.a[layer - 1], ahat, self.e[layer])
        self.prev2[...] = self.prev
        self.prev[...] = a
