"""Predictor registry.

A predictor maps a window of integer codes ``q`` (int64, shape (T, H, W[, C]), frame 0 is
the window's keyframe) to residuals and back, using only values the decoder already has,
so ``reconstruct(residuals(q)) == q`` exactly. The codec knows predictors only by name
through this registry; heavy ones (the learned predictor, which imports torch) register a
module path and are imported on first use.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any, Protocol

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
_CACHE: dict[tuple[str, str | None], Predictor] = {}
LEARNED = ("prednet", "prednet+interp")


def register(name: str, target: str) -> None:
    """Register ``name`` -> ``"module:attribute"`` (a class or factory; learned predictors
    take the model file path as keyword ``model``)."""
    _FACTORIES[name] = target


def names() -> list[str]:
    return list(_FACTORIES)


def get(name: str, model: str | None = None) -> Predictor:
    key = (name, model if name in LEARNED else None)
    if key in _CACHE:
        return _CACHE[key]
    target = _FACTORIES.get(name)
    if target is None:
        raise OptionError(f"unknown predictor '{name}'; choose one of "
                          f"{', '.join(['auto', 'classical', *_FACTORIES])}")
    module, _, attr = target.partition(":")
    factory = getattr(importlib.import_module(module), attr)
    pred = factory(model=model) if name in LEARNED else factory()
    _CACHE[key] = pred
    return pred


def learned_available(model: str | None = None) -> bool:
    """True when torch is installed and a model file (given, or the shipped default) exists."""
    if importlib.util.find_spec("torch") is None:
        return False
    if model is not None:
        return True
    from ..models_path import default_model_path

    return default_model_path().is_file()


def model_identity(options: Any) -> str | None:
    """SHA-256 of the model file ``options`` may use, or None when only classical predictors
    can run (computed without importing torch)."""
    import hashlib

    if not any(c in LEARNED for c in options.candidates()):
        return None
    from pathlib import Path

    path = options.model
    if path is None:
        from ..models_path import default_model_path
        path = default_model_path()
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError as exc:
        raise OptionError(f"model file {path}: {exc.strerror}") from None


for _name, _cls in (("zero", "classical:Zero"), ("previous", "classical:Previous"),
                    ("lorenzo", "classical:Lorenzo3D"), ("spatial", "classical:Lorenzo2D"),
                    ("interp", "classical:Interpolation"), ("prednet", "prednet:PredNetPredictor"),
                    ("prednet+interp", "prednet:PredNetSpatialPredictor")):
    register(_name, f"tezip.predictors.{_cls}")

# predictors tried by 'classical' and 'auto' ('auto' adds the learned ones when available)
CLASSICAL_CANDIDATES = ("previous", "lorenzo", "spatial", "interp")
