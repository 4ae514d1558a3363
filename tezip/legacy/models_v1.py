"""Format v1's learned forecaster (kept so that v1 files decode): a PredNet-style
recurrent network (Lotter et al., "Deep predictive coding networks for video prediction",
arXiv 1605.08104), its weights I/O and content hash.

Per layer l: a ConvLSTM representation unit R_l, a prediction unit Â_l = conv(R_l) and an
error unit E_l = [relu(A_l - Â_l), relu(Â_l - A_l)]; A_0 is the frame, A_{l+1} =
maxpool(relu(conv(E_l))). R_l is updated top-down from E_l of the previous step and the
upsampled R_{l+1}. Two changes for a codec: layer 0 predicts the *residual over the
previous reconstructed frame*, and R_0 also sees the two previous reconstructed frames
(their difference); both proved decisive in closed-loop coding (see MODEL_CARD.md).

Weights are stored with safetensors (loading never executes code); the configuration
travels in the file's metadata; the model's content hash is the SHA-256 of the file.

This module imports torch; nothing in the classical path imports it.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..atomic import atomic_output
from ..errors import InputError

MODEL_FORMAT = "tezip-prednet/1"


@dataclass(frozen=True)
class ModelConfig:
    """Architecture: image channels, hidden channels per layer (the depth is its length),
    error-unit channels of the upper layers, kernel size."""

    channels: int = 1
    hidden: tuple[int, ...] = (8,)
    a_channels: tuple[int, ...] = ()
    kernel: int = 3

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden", tuple(int(h) for h in self.hidden))
        a = tuple(int(x) for x in self.a_channels)
        if len(a) != len(self.hidden) - 1:
            a = tuple(2 * h for h in self.hidden[1:])
        object.__setattr__(self, "a_channels", a)
        if not self.hidden or min(self.hidden) < 1 or self.channels < 1 or self.kernel % 2 == 0:
            raise ValueError(f"invalid model configuration {self}")

    @property
    def depth(self) -> int:
        return len(self.hidden)


class ConvLSTMCell(nn.Module):
    def __init__(self, cin: int, hidden: int, kernel: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.conv = nn.Conv2d(cin + hidden, 4 * hidden, kernel, padding=kernel // 2)

    def forward(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        i, f, o, g = torch.chunk(self.conv(torch.cat([x, h], 1)), 4, 1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c


@dataclass
class State:
    r: list[torch.Tensor] = field(default_factory=list)
    c: list[torch.Tensor] = field(default_factory=list)
    e: list[torch.Tensor] = field(default_factory=list)


class PredNet(nn.Module):
    """Forecasts frame t from the reconstructed frames t-1, t-2 and its recurrent state.
    Tensors are (batch, channels, H, W) with H, W multiples of 2**(depth-1)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        C, hid, a = cfg.channels, cfg.hidden, cfg.a_channels
        e_ch = [2 * C] + [2 * x for x in a]
        cells = []
        for layer in range(cfg.depth):
            cin = e_ch[layer] + (hid[layer + 1] if layer + 1 < cfg.depth else 0)
            cin += 2 * C if layer == 0 else 0
            cells.append(ConvLSTMCell(cin, hid[layer], cfg.kernel))
        self.cells = nn.ModuleList(cells)
        self.ahat = nn.ModuleList(
            [nn.Conv2d(hid[0], C, cfg.kernel, padding=cfg.kernel // 2)]
            + [nn.Conv2d(hid[i], a[i - 1], cfg.kernel, padding=cfg.kernel // 2)
               for i in range(1, cfg.depth)])
        self.a_up = nn.ModuleList(
            [nn.Conv2d(e_ch[i], a[i], cfg.kernel, padding=cfg.kernel // 2)
             for i in range(cfg.depth - 1)])
        nn.init.zeros_(self.ahat[0].weight)   # start as the 'previous frame' predictor
        nn.init.zeros_(self.ahat[0].bias)
        self.e_ch = e_ch

    def initial_state(self, n: int, h: int, w: int, like: torch.Tensor) -> State:
        st = State()
        for layer in range(self.cfg.depth):
            s = 2 ** layer
            z = like.new_zeros((n, self.cfg.hidden[layer], h // s, w // s))
            st.r.append(z)
            st.c.append(z.clone())
            st.e.append(like.new_zeros((n, self.e_ch[layer], h // s, w // s)))
        return st

    def forecast(self, prev: torch.Tensor, prev2: torch.Tensor, st: State) -> torch.Tensor:
        """Top-down update of the representations; returns the forecast of the next frame."""
        for layer in reversed(range(self.cfg.depth)):
            parts = [st.e[layer]]
            if layer + 1 < self.cfg.depth:
                parts.append(F.interpolate(st.r[layer + 1], scale_factor=2, mode="nearest"))
            if layer == 0:
                parts += [prev, prev - prev2]
            st.r[layer], st.c[layer] = self.cells[layer](torch.cat(parts, 1), st.r[layer],
                                                          st.c[layer])
        return prev + self.ahat[0](st.r[0])

    def observe(self, frame: torch.Tensor, forecast: torch.Tensor, st: State) -> None:
        """Bottom-up error pass once the (reconstructed) frame is known."""
        e = torch.cat([F.relu(frame - forecast), F.relu(forecast - frame)], 1)
        st.e[0] = e
        for layer in range(1, self.cfg.depth):
            a = F.max_pool2d(F.relu(self.a_up[layer - 1](e)), 2)
            ahat = F.relu(self.ahat[layer](st.r[layer]))
            e = torch.cat([F.relu(a - ahat), F.relu(ahat - a)], 1)
            st.e[layer] = e

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        """Teacher-forced forecasts of frames 1..T-1 of (N, T, C, H, W) from the frames
        before them; returns (N, T-1, C, H, W)."""
        n, t, _, h, w = frames.shape
        st = self.initial_state(n, h, w, frames)
        out = []
        for i in range(1, t):
            prev2 = frames[:, i - 2] if i >= 2 else frames[:, 0]
            f = self.forecast(frames[:, i - 1], prev2, st)
            self.observe(frames[:, i], f, st)
            out.append(f)
        return torch.stack(out, 1)


# ---------------------------------------------------------------------------------------
# files


@dataclass
class LoadedModel:
    net: PredNet
    hash: str
    path: str
    meta: dict


def save_model(net: PredNet, path: str | os.PathLike, meta: dict | None = None) -> str:
    """Write weights (float32) + configuration as safetensors, atomically; returns the
    content hash."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(torch.float32).contiguous().cpu()
               for k, v in net.state_dict().items()}
    info = {"format": MODEL_FORMAT, "config": json.dumps(asdict(net.cfg)),
            "meta": json.dumps(meta or {})}
    with atomic_output(path, force=True) as tmp:       # a rerun replaces the model file
        save_file(tensors, tmp, metadata=info)
    return file_hash(path)


def file_hash(path: str | os.PathLike) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def load_model(path: str | os.PathLike) -> LoadedModel:
    """Load a model file (never executes code: safetensors only)."""
    from safetensors import safe_open

    path = Path(path)
    if path.is_dir():
        if (path / "model.safetensors").is_file():
            path = path / "model.safetensors"      # the directory 'tezip train' wrote
        else:
            raise InputError(f"{path} is a directory, not a model file; give the "
                             ".safetensors file that 'tezip train' wrote")
    if not path.is_file():
        raise InputError(f"model file {path} does not exist")
    try:
        with safe_open(str(path), framework="pt") as f:
            info = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    except Exception as exc:  # safetensors raises its own error types
        raise InputError(f"{path} is not a tezip model file ({exc})") from None
    if info.get("format") != MODEL_FORMAT:
        raise InputError(f"{path} is not a tezip model file (format {info.get('format')!r})")
    cfg = json.loads(info["config"])
    net = PredNet(ModelConfig(**cfg))
    try:
        net.load_state_dict(tensors)
    except RuntimeError as exc:
        raise InputError(f"{path}: weights do not match the configuration ({exc})") from None
    net.eval()
    return LoadedModel(net, file_hash(path), str(path), json.loads(info.get("meta", "{}")))


