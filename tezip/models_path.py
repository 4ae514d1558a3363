"""Where the shipped models live (no torch, no numba: the command line asks this too)."""

from __future__ import annotations

import os
from pathlib import Path


def pretrained_dir() -> Path:
    """``$TEZIP_PRETRAINED`` if set, else the package data ``tezip.pretrained`` (the
    repository's ``pretrained/`` directory)."""
    env = os.environ.get("TEZIP_PRETRAINED")
    if env:
        return Path(env)
    from importlib.resources import files

    return Path(str(files("tezip.pretrained")))


def default_model_path() -> Path:
    """The shipped forecaster (format v2)."""
    return pretrained_dir() / "default.safetensors"


def v1_model_path() -> Path:
    """The forecaster format-v1 files were written with."""
    return pretrained_dir() / "prednet-v1.safetensors"
