"""Where the shipped model lives (no torch import: the classical path asks this too)."""

from __future__ import annotations

import os
from pathlib import Path


def pretrained_dir() -> Path:
    """``$TEZIP_PRETRAINED`` if set, else the repository's ``pretrained/``."""
    env = os.environ.get("TEZIP_PRETRAINED")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent / "pretrained"


def default_model_path() -> Path:
    return pretrained_dir() / "default.safetensors"
