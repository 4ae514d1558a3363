"""Predictors: the stage that turns a window of values into integer codes (and back),
behind typed interfaces and a registry.

- ``ValuePredictor``: values and a quantizer in, codes and an exact reconstruction out
  (predict-quantize-reconstruct, fused in a compiled kernel); decoding is fused with the
  entropy decoding. The classical ones (``interp``, ``lorenzo``, ``spatial``) and the
  learned one (``learned``: a forecast of each frame plus a spatial stage on its error).
- ``GridPredictor``: integer codes in and out (the bit patterns of bit-exact floats).
- ``shuffle`` (``shuffle.ByteShuffle``): bit-exact floats as byte planes + zstd; it
  writes its own payload sections instead of codes, and a window takes it instead of
  ``bits`` when it codes smaller (``LOSSLESS``).

Each predictor proposes its own configurations (``configs``); the codec ranks them by
estimated size on a sample of the window and codes the window with the best. The codec
knows predictors only by name through this registry; the learned one is imported on
first use (it may load torch to train, never to decode).
"""

from __future__ import annotations

import importlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from ..errors import OptionError
from ..quantize import Quantizer

_FACTORIES: dict[str, str] = {}
_CACHE: dict[str, Any] = {}
_LOCK = threading.Lock()


# what the entropy coder codes: codes, contexts, number of contexts, groups, and the
# configuration keys the decoder needs besides the predictor's configuration
Symbols = tuple[np.ndarray, np.ndarray, int, np.ndarray, dict]


@dataclass
class Coded:
    """One window (or sample) coded by a predictor."""

    config: dict                 # what the decoder needs besides the streams (JSON)
    codes: np.ndarray            # int32, FLAG for outliers (value) / int64 (grid)
    ctx: np.ndarray              # uint8 contexts, in decoding order
    outliers: np.ndarray         # int64 flat positions of the values stored exactly
    out: np.ndarray | None       # the reconstruction (native dtype); None for samples
    n_ctx: int
    groups: np.ndarray
    has_outliers: bool = True
    extra: dict = field(default_factory=dict)   # e.g. a learned forecast's checksum
    # another coding of the codes the window may be written with, made on demand: what
    # the entropy coder then codes instead of (codes, ctx, n_ctx, groups), and the
    # configuration keys the decoder needs besides ``config`` (the Lorenzo predictors'
    # run coding, format v6), or None where it does not pay
    recode: Callable[[], Symbols | None] | None = None
    # set by ``recode``: [True] where the coding it returned may code larger than the
    # codes themselves (the packer then codes both, the smaller kept)
    recheck: list[bool] = field(default_factory=lambda: [False])

    def entropy_input(self, write: bool = False) -> Symbols:
        """(codes, contexts, number of contexts, groups, configuration keys to add) for
        the entropy coder: to write the window (``write``), its ``recode`` where that
        pays; to estimate its size (the tuning), the codes themselves."""
        if write and self.recode is not None:
            alt = self.recode()
            if alt is not None:
                return alt
        return self.codes, self.ctx, self.n_ctx, self.groups, {}


class ValuePredictor(ABC):
    """Predict-quantize-reconstruct over a window (T, H, W[, C]) of values."""

    name: ClassVar[str]
    n_ctx: ClassVar[int]
    groups: ClassVar[np.ndarray]
    # configuration keys whose settings the tuning sample ranks as the whole window does:
    # of two configurations that differ only there, the codec keeps the sample's better
    # one and ranks only the other settings on the window itself
    sample_ranked: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def configs(self, x: np.ndarray, quant: Quantizer) -> list[dict]:
        """Candidate configurations for this window, most likely first."""

    def contexts(self, config: dict) -> int:
        """The number of entropy contexts a window of (validated) ``config`` codes."""
        return self.n_ctx

    def reads(self, config: dict) -> int:
        """The most symbols the decoder reads for one point (its streams are padded
        for that many a point)."""
        return 1

    def variant(self, config: dict) -> dict:
        """``config`` without its ``sample_ranked`` settings."""
        return {k: v for k, v in config.items() if k not in self.sample_ranked}

    def tune(self, sample: np.ndarray, quant: Quantizer, sgn: np.ndarray,
             cost: Callable[[Coded], float],
             pmap: Callable[[Callable, list], Iterable] = map) -> list[tuple[float, dict]]:
        """(estimated bits, configuration) of the configurations tried on ``sample``,
        best first; this default tries every one. ``pmap``: ``map`` over independent
        trials (the encoder's threads; the result does not depend on it)."""
        cfgs = self.configs(sample, quant)
        bits = pmap(lambda c: cost(self.encode(sample, quant, c, sgn, sample=True)), cfgs)
        tried = [(b, i, c) for i, (b, c) in enumerate(zip(bits, cfgs, strict=True))]
        return [(b, c) for b, _, c in sorted(tried, key=lambda t: t[:2])]

    @abstractmethod
    def validate(self, config: Any, shape: tuple[int, ...]) -> dict:
        """A configuration read from a file, checked (CorruptFileError if it is not one
        this predictor could have written)."""

    @abstractmethod
    def encode(self, x: np.ndarray, quant: Quantizer, config: dict, sgn: np.ndarray,
               sample: bool = False) -> Coded:
        """Code ``x`` (C-contiguous, native dtype); ``sgn``: the sign/zero map of the
        point-wise relative mode (else a dummy). ``sample``: only codes and contexts are
        needed (ranking)."""

    # whether ``fitted`` may give a configuration (the encoder then codes the window's
    # first frames with this predictor even where it is the only finalist)
    fits: ClassVar[bool] = False

    def fitted(self, config: dict, coded: Coded, shape: tuple[int, ...]) -> dict | None:
        """A configuration fitted to ``coded``, this predictor's coding under ``config``
        of a window of ``shape`` (full codes, not a sample's), to be ranked beside
        ``config``; None: none (the default)."""
        return None

    def extends(self, shape: tuple[int, ...]) -> bool:
        """Whether the coding of a window of ``shape`` begins with the coding of its first
        frames on their own (frames coded apart, one channel), so that ``extend`` can
        reuse it. False unless a predictor says otherwise."""
        return False

    def extend(self, head: Coded, x: np.ndarray, quant: Quantizer, config: dict,
               sgn: np.ndarray) -> Coded:
        """The coding of the window ``x`` under ``config`` that ``encode`` gives, from
        ``head``, the full coding (not a sample's) of its first frames under ``config``:
        only the frames after them are coded (``sgn``: their sign/zero map). Only where
        ``extends(x.shape)``."""
        raise NotImplementedError(f"'{self.name}' does not extend a coding")

    @abstractmethod
    def decode(self, shape: tuple[int, ...], quant: Quantizer, config: dict, tables: Any,
               outlier_values: np.ndarray, sgn: np.ndarray, meta: dict | None = None,
               out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(reconstruction with finite outliers in place, outlier positions in coding
        order) from the entropy ``tables``; the caller puts every outlier's exact value
        in and checks that all streams were consumed. ``meta``: the window's record (a
        learned predictor checks its forecast checksum there). ``out``: a C-contiguous
        array of ``shape`` and the output dtype the predictor may decode into (and then
        return), to spare the caller a copy; or None."""


class GridPredictor(ABC):
    """Integer codes (uint64, modulo 2^64) in and out: bit-exact coding."""

    name: ClassVar[str]
    n_ctx: ClassVar[int]
    groups: ClassVar[np.ndarray]

    @abstractmethod
    def configs(self, q: np.ndarray) -> list[dict]: ...

    def contexts(self, config: dict) -> int:
        return self.n_ctx

    def reads(self, config: dict) -> int:
        return 1

    @abstractmethod
    def validate(self, config: Any, shape: tuple[int, ...]) -> dict: ...

    @abstractmethod
    def encode(self, q: np.ndarray, config: dict) -> Coded: ...

    @abstractmethod
    def decode(self, shape: tuple[int, ...], config: dict, tables: Any) -> np.ndarray: ...


def register(name: str, target: str) -> None:
    """Register ``name`` -> ``"module:attribute"`` (a class, instantiated once)."""
    _FACTORIES[name] = target


def names() -> list[str]:
    return list(_FACTORIES)


def get(name: str) -> Any:
    """The (stateless, thread-safe) predictor registered as ``name``."""
    pred = _CACHE.get(name)
    if pred is not None:
        return pred
    target = _FACTORIES.get(name)
    if target is None:
        raise OptionError(f"unknown predictor '{name}'; choose one of "
                          f"{', '.join(['auto', 'classical', *_FACTORIES])}")
    module, _, attr = target.partition(":")
    with _LOCK:
        pred = _CACHE.get(name)
        if pred is None:
            pred = getattr(importlib.import_module(module), attr)()
            _CACHE[name] = pred
    return pred


for _name, _target in (("interp", "classical:Interpolation"), ("lorenzo", "classical:Lorenzo3D"),
                       ("spatial", "classical:Lorenzo2D"), ("bits", "lossless:BitsLorenzo"),
                       ("shuffle", "shuffle:ByteShuffle"), ("wavelet", "transform:Wavelet")):
    register(_name, f"tezip.predictors.{_target}")

# the codings of bit-exact floats, chosen per window by their real size
LOSSLESS = ("bits", "shuffle")

# tried by 'classical' and 'auto'
CLASSICAL_CANDIDATES = ("interp", "lorenzo", "spatial")

# the transform coder (``transform.Wavelet``, format v8): tried by 'auto' beside the
# classical predictors on the first window (``codec.tune``)
TRANSFORM = "wavelet"


def model_identity(options: Any) -> str | None:
    """SHA-256 of the learned model ``options`` may use (the given file, else the
    shipped default); None when only classical predictors can run."""
    if options.predictor not in ("auto", "learned") or options.bound.mode == "pwrel":
        return None
    from ..learned import registry

    if options.model is not None:
        return registry.from_file(str(options.model)).hash
    m = registry.default()
    return None if m is None else m.hash
