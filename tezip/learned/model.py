"""The forecaster's architecture, parameters and files (numpy only: no torch, no numba).

Per layer l a ConvLSTM representation unit R_l (gates: hardsigmoid, candidate and output:
hardtanh, so inference is exact arithmetic), a prediction unit Â_l = conv(R_l) and error
units E_l = [relu(A_l - Â_l), relu(Â_l - A_l)]; A_0 is the (normalized, reconstructed)
frame, A_{l+1} = maxpool(relu(conv(E_l))). At each step R is updated top-down from the
error units of the last step, the upsampled R_{l+1} and, for layer 0, the previous frame
and its change (``inputs``); Â_0 forecasts the change over the previous frame, so the
forecast is prev + Â_0 (an untrained layer predicts 'no change').

Model files are safetensors (a JSON header, then raw little-endian arrays; loading never
executes code), weights stored as float16, the configuration in the header's metadata.
The content hash (SHA-256 of the file) names a model in .tez headers and manifests.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..errors import CorruptFileError, InputError

MODEL_FORMAT = "tezip-prednet/2"
MAX_MODEL_BYTES = 8 << 20        # a file's embedded model may be at most this large
INPUTS = ("prev", "diff")         # extra inputs of layer 0: previous frame, its change


@dataclass(frozen=True)
class ModelConfig:
    """Architecture: data channels, ConvLSTM channels per layer (the depth is its
    length), A-unit channels of the upper layers, extra inputs of layer 0."""

    channels: int = 1
    hidden: tuple[int, ...] = (4,)
    a_channels: tuple[int, ...] = ()
    inputs: tuple[str, ...] = INPUTS

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden", tuple(int(h) for h in self.hidden))
        a = tuple(int(x) for x in self.a_channels)
        if len(a) != len(self.hidden) - 1:
            a = tuple(2 * h for h in self.hidden[1:])
        object.__setattr__(self, "a_channels", a)
        object.__setattr__(self, "inputs", tuple(str(s) for s in self.inputs))
        if (not self.hidden or min(self.hidden) < 1 or max(self.hidden) > 256
                or not 1 <= self.channels <= 16 or len(self.hidden) > 4
                or any(s not in INPUTS for s in self.inputs) or (a and min(a) < 1)):
            raise ValueError(f"invalid model configuration {self}")

    @property
    def depth(self) -> int:
        return len(self.hidden)

    def e_channels(self, layer: int) -> int:
        return 2 * (self.channels if layer == 0 else self.a_channels[layer - 1])

    def cell_inputs(self, layer: int) -> int:
        """Input channels of layer ``layer``'s gate convolution (its own R included)."""
        n = self.e_channels(layer) + self.hidden[layer]
        if layer + 1 < self.depth:
            n += self.hidden[layer + 1]
        if layer == 0:
            n += len(self.inputs) * self.channels
        return n

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Parameter name -> shape (3x3 convolutions throughout)."""
        out: dict[str, tuple[int, ...]] = {}
        for layer in range(self.depth):
            h = self.hidden[layer]
            out[f"cell{layer}.weight"] = (4 * h, self.cell_inputs(layer), 3, 3)
            out[f"cell{layer}.bias"] = (4 * h,)
            ach = self.channels if layer == 0 else self.a_channels[layer - 1]
            out[f"ahat{layer}.weight"] = (ach, h, 3, 3)
            out[f"ahat{layer}.bias"] = (ach,)
            if layer + 1 < self.depth:
                out[f"aup{layer}.weight"] = (self.a_channels[layer], self.e_channels(layer), 3, 3)
                out[f"aup{layer}.bias"] = (self.a_channels[layer],)
        return out

    def n_params(self) -> int:
        return sum(math.prod(s) for s in self.shapes().values())

    def macs_per_pixel(self) -> float:
        """Multiply-adds per pixel of a frame for one forecast-and-observe step."""
        total = 0.0
        for name, shape in self.shapes().items():
            if name.endswith(".weight"):          # layer l runs at 1/2^l resolution
                total += math.prod(shape) * 4.0 ** -int(name.split(".")[0][-1])
        return total

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ModelConfig:
        d = json.loads(text)
        if not isinstance(d, dict):
            raise ValueError("model configuration is not an object")
        return cls(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items()})


@dataclass
class Model:
    """A loaded model: configuration, float32 parameters, the file's bytes and hash."""

    config: ModelConfig
    params: dict[str, np.ndarray]
    data: bytes
    hash: str
    meta: dict = field(default_factory=dict)
    path: str | None = None

    @property
    def channels(self) -> int:
        return self.config.channels


def to_bytes(config: ModelConfig, params: dict[str, np.ndarray], meta: dict | None = None
             ) -> bytes:
    """The model file's bytes (safetensors layout, float16 weights)."""
    shapes = config.shapes()
    if set(params) != set(shapes):
        raise ValueError(f"parameters {sorted(params)} do not match the configuration "
                         f"({sorted(shapes)})")
    header: dict = {"__metadata__": {"format": MODEL_FORMAT, "config": config.to_json(),
                                     "meta": json.dumps(meta or {}, sort_keys=True)}}
    blobs, pos = [], 0
    for name in sorted(shapes):
        a = np.asarray(params[name], np.float32).astype("<f2")
        if a.shape != shapes[name] or not np.all(np.isfinite(a)):
            raise ValueError(f"parameter {name}: shape {a.shape} (want {shapes[name]}) or "
                             "values beyond float16")
        b = a.tobytes()
        header[name] = {"dtype": "F16", "shape": list(a.shape), "data_offsets": [pos, pos + len(b)]}
        blobs.append(b)
        pos += len(b)
    h = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    h += b" " * ((-len(h)) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def from_bytes(data: bytes, where: str = "model") -> Model:
    """Parse and check model bytes; any inconsistency is a CorruptFileError."""
    bad = CorruptFileError(f"{where}: not a valid tezip model")
    if len(data) < 8 or len(data) > MAX_MODEL_BYTES:
        raise bad
    (hlen,) = struct.unpack_from("<Q", data)
    if hlen > len(data) - 8:
        raise bad
    try:
        header = json.loads(data[8:8 + hlen])
        info = header.pop("__metadata__")
        if info.get("format") != MODEL_FORMAT:
            raise ValueError("format")
        config = ModelConfig.from_json(info["config"])
        meta = json.loads(info.get("meta") or "{}")
    except (ValueError, KeyError, TypeError, AttributeError):
        raise bad from None
    shapes = config.shapes()
    if set(header) != set(shapes):
        raise bad
    body = memoryview(data)[8 + hlen:]
    params = {}
    end = 0
    for name, shape in shapes.items():
        rec = header[name]
        try:
            a, b = (int(v) for v in rec["data_offsets"])
            ok = rec["dtype"] == "F16" and [int(s) for s in rec["shape"]] == list(shape)
        except (KeyError, TypeError, ValueError):
            raise bad from None
        if not ok or not 0 <= a <= b <= len(body) or b - a != 2 * math.prod(shape):
            raise bad
        params[name] = np.frombuffer(body[a:b], "<f2").astype(np.float32).reshape(shape)
        end = max(end, b)
    if end != len(body):
        raise bad
    return Model(config, params, bytes(data), hashlib.sha256(data).hexdigest(), meta)


def load(path: str | os.PathLike) -> Model:
    """A model file (a directory written by ``tezip train`` holds ``model.safetensors``)."""
    p = Path(path)
    if p.is_dir():
        if (p / "model.safetensors").is_file():
            p = p / "model.safetensors"
        else:
            raise InputError(f"{p} is a directory without model.safetensors; give the model "
                             "file that 'tezip train' wrote")
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise InputError(f"model file {p} does not exist") from None
    except OSError as exc:
        raise InputError(f"model file {p}: {exc.strerror}") from None
    try:
        m = from_bytes(data, str(p))
    except CorruptFileError:
        raise InputError(f"{p} is not a tezip model file (format {MODEL_FORMAT})") from None
    m.path = str(p)
    return m


def init_params(config: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Fresh parameters: small random gates, the change predictor at zero (an untrained
    model forecasts 'no change', the previous frame)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in config.shapes().items():
        if name.endswith(".bias") or name == "ahat0.weight":
            out[name] = np.zeros(shape, np.float32)
        else:
            fan_in = math.prod(shape[1:])
            out[name] = (rng.standard_normal(shape) / math.sqrt(fan_in)).astype(np.float32)
    return out
