"""Predictor registry.

A predictor maps a window of integer codes ``q`` (int64, shape (T, H, W[, C]), frame 0 is
the window's keyframe) to residuals and back, using only values the decoder already has,
so ``reconstruct(residuals(q)) == q`` exactly. The codec knows predictors only by name
through this registry; heavy ones (the learned predictor, which imports torch) register a
module path and are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import Protocol

from ..errors import OptionError


class Predictor(Protocol):
    """``domain == "grid"``: ``encode(q) -> (codes, contexts, q)`` on integer grid codes and
    ``decode(shape, take) -> q``. ``domain == "value"``: ``encode(y, grid) -> (codes,
    contexts, reconstruction)`` on float64 values and ``decode(shape, grid, take)``, plus a
    ``grid_fallback`` predictor for bit-exact float coding. ``codes`` and ``contexts`` are
    flat, in the order the decoder asks for them through ``take(contexts) -> codes``."""

    name: str
    domain: str
    n_contexts: int


_FACTORIES: dict[str, str] = {}
_CACHE: dict[str, Predictor] = {}


def register(name: str, target: str) -> None:
    """Register ``name`` -> ``"module:attribute"`` (a class or factory taking no args)."""
    _FACTORIES[name] = target


def names() -> list[str]:
    return list(_FACTORIES)


def get(name: str) -> Predictor:
    if name in _CACHE:
        return _CACHE[name]
    target = _FACTORIES.get(name)
    if target is None:
        raise OptionError(f"unknown predictor '{name}'; choose one of "
                          f"{', '.join(['auto', *_FACTORIES])}")
    module, _, attr = target.partition(":")
    pred = getattr(importlib.import_module(module), attr)()
    _CACHE[name] = pred
    return pred


for _name, _cls in (("zero", "Zero"), ("previous", "Previous"), ("lorenzo", "Lorenzo3D"),
                    ("spatial", "Lorenzo2D"), ("interp", "Interpolation")):
    register(_name, f"tezip.predictors.classical:{_cls}")

# predictors tried by 'auto' (cheapest first)
AUTO_CANDIDATES = ("previous", "lorenzo", "spatial", "interp")
