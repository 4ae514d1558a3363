"""The forecaster in torch, for training: the same architecture as ``runtime`` (same
parameters, concatenation order, gate order and piecewise-linear activations), batched
over clips. Imports torch: only ``tezip train`` and ``--adapt`` load this module."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .model import ModelConfig


def hardsigmoid(x: torch.Tensor) -> torch.Tensor:
    return torch.clamp(x * (1.0 / 6.0) + 0.5, 0.0, 1.0)


def hardtanh(x: torch.Tensor) -> torch.Tensor:
    return torch.clamp(x, -1.0, 1.0)


class PredNet(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.params = nn.ParameterDict()
        for name, shape in cfg.shapes().items():
            self.params[name.replace(".", "_")] = nn.Parameter(torch.zeros(shape))

    def p(self, name: str) -> torch.Tensor:
        return self.params[name.replace(".", "_")]

    def load_numpy(self, params: dict[str, np.ndarray]) -> None:
        with torch.no_grad():
            for name, v in params.items():
                self.p(name).copy_(torch.from_numpy(np.asarray(v, np.float32)))

    def numpy_params(self) -> dict[str, np.ndarray]:
        return {name: self.p(name).detach().cpu().numpy().astype(np.float32)
                for name in self.cfg.shapes()}

    def _conv(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.conv2d(x, self.p(f"{name}.weight"), self.p(f"{name}.bias"), padding=1)

    def forward(self, frames: torch.Tensor, inputs: torch.Tensor | None = None) -> torch.Tensor:
        """Forecasts of frames 1..T-1 of ``frames`` (N, T, C, H, W), normalized; the
        network sees ``inputs`` (the same frames as reconstructed, e.g. noised; default
        ``frames``) and its error units compare its forecasts with them, as in the
        codec's closed loop. Returns (N, T-1, C, H, W)."""
        cfg = self.cfg
        x_in = frames if inputs is None else inputs
        n, t, c, h, w = frames.shape
        sizes = [(h, w)]
        for _ in range(1, cfg.depth):
            sizes.append(((sizes[-1][0] + 1) // 2, (sizes[-1][1] + 1) // 2))
        z = frames.new_zeros
        r = [z((n, hd, *sizes[i])) for i, hd in enumerate(cfg.hidden)]
        cell = [z((n, hd, *sizes[i])) for i, hd in enumerate(cfg.hidden)]
        e = [z((n, cfg.e_channels(i), *sizes[i])) for i in range(cfg.depth)]
        prev = x_in[:, 0]
        prev2 = x_in[:, 0]
        out = []
        for step in range(1, t):
            for layer in reversed(range(cfg.depth)):
                parts = [e[layer]]
                if layer + 1 < cfg.depth:
                    up = F.interpolate(r[layer + 1], scale_factor=2, mode="nearest")
                    parts.append(up[..., :sizes[layer][0], :sizes[layer][1]])
                if layer == 0:
                    for name in cfg.inputs:
                        parts.append(prev if name == "prev" else prev - prev2)
                parts.append(r[layer])
                g = self._conv(torch.cat(parts, 1), f"cell{layer}")
                hd = cfg.hidden[layer]
                gi, gf, gg, go = (g[:, k * hd:(k + 1) * hd] for k in range(4))
                cell[layer] = hardsigmoid(gf) * cell[layer] + hardsigmoid(gi) * hardtanh(gg)
                r[layer] = hardsigmoid(go) * hardtanh(cell[layer])
            fc = prev + self._conv(r[0], "ahat0")
            out.append(fc)
            a = x_in[:, step]
            e[0] = torch.cat([F.relu(a - fc), F.relu(fc - a)], 1)
            for layer in range(1, cfg.depth):
                full = F.relu(self._conv(e[layer - 1], f"aup{layer - 1}"))
                a_l = F.max_pool2d(full, 2, ceil_mode=True)
                ahat = F.relu(self._conv(r[layer], f"ahat{layer}"))
                e[layer] = torch.cat([F.relu(a_l - ahat), F.relu(ahat - a_l)], 1)
            prev2, prev = prev, a
        return torch.stack(out, 1)
