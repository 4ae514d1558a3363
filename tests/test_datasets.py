"""Fast, offline tests for datasets/build.py: FITS reader and atomic .npy writing."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

BUILD_PY = Path(__file__).resolve().parent.parent / "datasets" / "build.py"


@pytest.fixture(scope="module")
def build() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tezip_datasets_build", BUILD_PY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _card(key: str, value: str = "", comment: str = "") -> bytes:
    if key in ("END", "COMMENT", "HISTORY", ""):
        text = f"{key:<8}{value}"
    else:
        text = f"{key:<8}= {value:>20}"
        if comment:
            text += f" / {comment}"
    assert len(text) <= 80
    return text.ljust(80).encode("ascii")


def _fits(cards: list[bytes], data: bytes) -> bytes:
    header = b"".join(cards) + _card("END")
    header += b" " * (-len(header) % 2880)
    return header + data + b"\0" * (-len(data) % 2880)


def _cube_cards(bitpix: int, shape: tuple[int, ...]) -> list[bytes]:
    cards = [_card("SIMPLE", "T"), _card("BITPIX", str(bitpix)), _card("NAXIS", str(len(shape)))]
    for k, n in enumerate(reversed(shape), start=1):
        cards.append(_card(f"NAXIS{k}", str(n)))
    return cards


def test_fits_float32_big_endian_axis_order(build: ModuleType) -> None:
    rng = np.random.default_rng(1)
    cube = rng.normal(size=(3, 4, 5)).astype(np.float32)  # (T, H, W)
    cards = _cube_cards(-32, cube.shape)
    cards += [
        _card("COMMENT", "a comment card = with an equals sign"),
        _card("OBJECT", "'it''s a test'", "string with a quote"),
        _card("EXPTIME", "1.5D0"),
    ]
    arr = build.read_fits_primary(_fits(cards, cube.astype(">f4").tobytes()))
    assert arr.shape == (3, 4, 5)
    assert arr.dtype == np.dtype(np.float32) and arr.dtype.isnative
    np.testing.assert_array_equal(arr, cube)
    header, start = build.parse_fits_header(_fits(cards, b""))
    assert start == 2880
    assert header["OBJECT"] == "it's a test"
    assert header["EXPTIME"] == 1.5
    assert header["NAXIS1"] == 5 and header["NAXIS3"] == 3


def test_fits_bscale_bzero(build: ModuleType) -> None:
    stored = np.arange(-6, 6, dtype=np.int16).reshape(3, 4)
    cards = _cube_cards(16, stored.shape) + [_card("BSCALE", "0.5"), _card("BZERO", "100.0")]
    arr = build.read_fits_primary(_fits(cards, stored.astype(">i2").tobytes()))
    assert arr.shape == (3, 4)
    assert arr.dtype == np.float32
    np.testing.assert_array_equal(arr, 100.0 + 0.5 * stored.astype(np.float32))


def test_fits_unsigned_convention(build: ModuleType) -> None:
    values = np.array([[0, 1, 32767], [32768, 40000, 65535]], dtype=np.uint16)
    stored = (values.astype(np.int32) - 32768).astype(">i2")
    cards = _cube_cards(16, values.shape) + [_card("BSCALE", "1"), _card("BZERO", "32768")]
    arr = build.read_fits_primary(_fits(cards, stored.tobytes()))
    assert arr.dtype == np.uint16
    np.testing.assert_array_equal(arr, values)


def test_fits_errors(build: ModuleType) -> None:
    cards = _cube_cards(-32, (2, 2))
    good = _fits(cards, np.zeros((2, 2), ">f4").tobytes())
    with pytest.raises(build.FitsError):
        build.read_fits_primary(good[:2880])  # data missing
    with pytest.raises(build.FitsError):
        build.read_fits_primary(b" " * 2880)  # no END card
    with pytest.raises(build.FitsError):
        build.read_fits_primary(_fits(_cube_cards(12, (2, 2)), b"\0" * 16))


def test_atomic_save_and_up_to_date(build: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "sub" / "x.npy"
    arr = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    build.atomic_save_npy(path, arr)
    np.testing.assert_array_equal(np.load(path), arr)
    assert sorted(p.name for p in path.parent.iterdir()) == ["x.npy"]  # no temp left
    assert build.is_up_to_date(path, (2, 3, 4), "float32")
    assert not build.is_up_to_date(path, (2, 3, 5), "float32")
    assert not build.is_up_to_date(path, (2, 3, 4), "float64")
    assert not build.is_up_to_date(tmp_path / "missing.npy", (2, 3, 4), "float32")
    path.write_bytes(b"garbage")
    assert not build.is_up_to_date(path, (2, 3, 4), "float32")


def test_atomic_save_failure_keeps_old_file(
    build: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "x.npy"
    old = np.ones(3, dtype=np.float32)
    build.atomic_save_npy(path, old)

    def boom(src: str, dst: str) -> None:
        raise OSError("simulated crash before rename")

    monkeypatch.setattr(build.os, "replace", boom)
    with pytest.raises(OSError):
        build.atomic_save_npy(path, np.zeros(3, dtype=np.float32))
    np.testing.assert_array_equal(np.load(path), old)
    assert os.listdir(tmp_path) == ["x.npy"]


def test_main_skips_up_to_date(
    build: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ds = build.DATASETS["iris_sji2796"]
    build.atomic_save_npy(tmp_path / f"{ds.name}.npy", np.zeros(ds.shape, dtype=ds.dtype))
    assert build.main([ds.name, "--out", str(tmp_path)]) == 0  # no network: nothing to build
    assert "up to date" in capsys.readouterr().out
