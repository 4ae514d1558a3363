"""Rebuild the project's real time-series image stacks from pip packages that carry the data.

Usage::

    python datasets/build.py [NAME ...] [--out DIR] [--force]

Each data set is written to ``DIR/NAME.npy`` (default ``DIR`` is ``data/`` under the repo
root) as a (T, H, W) array. Files are written atomically (temporary name in the same
directory, then ``os.replace``). A file that already exists with the expected shape and
dtype is left alone ("up to date").

Only numpy is needed up front; everything else is fetched with ``pip`` into a temporary
directory, never into the running environment. See ``datasets/README.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "data"
FITS_BLOCK = 2880
FITS_CARD = 80

# ---------------------------------------------------------------------------------------
# Minimal FITS primary-HDU reader
# ---------------------------------------------------------------------------------------

_BITPIX_DTYPES: dict[int, str] = {
    8: "u1",
    16: ">i2",
    32: ">i4",
    64: ">i8",
    -32: ">f4",
    -64: ">f8",
}


class FitsError(ValueError):
    """Raised when a byte string is not a FITS primary HDU this reader understands."""


def _parse_card_value(raw: str) -> str | int | float | bool | None:
    """Parse the value field (columns 11-80) of a FITS header card."""
    text = raw.strip()
    if not text:
        return None
    if text.startswith("'"):
        # Character string: quotes inside are doubled (''); a lone quote ends the string.
        out: list[str] = []
        i = 1
        while i < len(text):
            ch = text[i]
            if ch == "'":
                if i + 1 < len(text) and text[i + 1] == "'":
                    out.append("'")
                    i += 2
                    continue
                break
            out.append(ch)
            i += 1
        return "".join(out).rstrip()
    value = text.split("/", 1)[0].strip()
    if value == "T":
        return True
    if value == "F":
        return False
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        pass
    try:
        return float(value.replace("D", "E").replace("d", "e"))
    except ValueError:
        return value


def parse_fits_header(buf: bytes, offset: int = 0) -> tuple[dict[str, object], int]:
    """Parse the header starting at ``offset``.

    Returns the keyword dictionary (first occurrence wins; COMMENT/HISTORY/blank cards are
    skipped) and the byte offset where the data unit starts (header padded to 2880 bytes).
    """
    header: dict[str, object] = {}
    pos = offset
    while True:
        if pos + FITS_BLOCK > len(buf):
            raise FitsError("FITS header ended without an END card")
        block = buf[pos : pos + FITS_BLOCK]
        pos += FITS_BLOCK
        for i in range(0, FITS_BLOCK, FITS_CARD):
            card = block[i : i + FITS_CARD].decode("ascii", errors="replace")
            key = card[:8].strip().upper()
            if key == "END":
                return header, pos
            if not key or key in ("COMMENT", "HISTORY") or card[8:10] != "= ":
                continue
            header.setdefault(key, _parse_card_value(card[10:]))


def read_fits_primary(buf: bytes) -> np.ndarray:
    """Return the primary-HDU image of a FITS file as a numpy array.

    The axis order is reversed relative to the FITS NAXISn keywords, as in astropy, so a
    cube with NAXIS1=W, NAXIS2=H, NAXIS3=T comes back as shape (T, H, W). Values are
    big-endian on disk; the result is native-endian. If BSCALE/BZERO are present and not
    the identity, ``BZERO + BSCALE * stored`` is applied (float32 for 8/16-bit and float
    data, float64 for 32/64-bit integers), except the standard unsigned-integer convention
    (BSCALE=1, BZERO=2**(bits-1)) which yields uint16/uint32/uint64 exactly. BLANK is not
    interpreted.
    """
    header, data_start = parse_fits_header(buf)
    if header.get("SIMPLE") is not True:
        raise FitsError("not a FITS primary HDU (SIMPLE = T missing)")
    bitpix = header.get("BITPIX")
    naxis = header.get("NAXIS")
    if not isinstance(bitpix, int) or bitpix not in _BITPIX_DTYPES:
        raise FitsError(f"unsupported BITPIX {bitpix!r}")
    if not isinstance(naxis, int) or naxis < 0:
        raise FitsError(f"bad NAXIS {naxis!r}")
    dims: list[int] = []
    for k in range(1, naxis + 1):
        n = header.get(f"NAXIS{k}")
        if not isinstance(n, int) or n < 0:
            raise FitsError(f"bad NAXIS{k} {n!r}")
        dims.append(n)
    dtype = np.dtype(_BITPIX_DTYPES[bitpix])
    shape = tuple(reversed(dims))
    count = int(np.prod(shape, dtype=np.int64)) if naxis else 0
    nbytes = count * dtype.itemsize
    if data_start + nbytes > len(buf):
        raise FitsError(f"FITS data truncated: need {nbytes} bytes, have {len(buf) - data_start}")
    stored = np.frombuffer(buf, dtype=dtype, count=count, offset=data_start).reshape(shape)

    bscale = float(header.get("BSCALE", 1.0))  # type: ignore[arg-type]
    bzero = float(header.get("BZERO", 0.0))  # type: ignore[arg-type]
    if bscale == 1.0 and bzero == 0.0:
        return stored.astype(dtype.newbyteorder("="))
    if bitpix in (16, 32, 64) and bscale == 1.0 and bzero == float(2 ** (bitpix - 1)):
        unsigned = np.dtype(f"u{bitpix // 8}")
        flipped = stored.astype(dtype.newbyteorder("=")).view(unsigned)
        return flipped ^ unsigned.type(1 << (bitpix - 1))
    out_dtype = np.float64 if bitpix in (32, 64) or bitpix == -64 else np.float32
    return (stored.astype(out_dtype) * out_dtype(bscale) + out_dtype(bzero)).astype(out_dtype)


# ---------------------------------------------------------------------------------------
# Output helpers
# ---------------------------------------------------------------------------------------


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_save_npy(path: Path, arr: np.ndarray) -> None:
    """Write ``arr`` to ``path`` in .npy format via a temporary file and ``os.replace``.

    Readers never see a partially written file; on failure the temporary file is removed
    and any existing ``path`` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            np.save(fh, arr, allow_pickle=False)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp_name, 0o666 & ~_current_umask())
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


def is_up_to_date(path: Path, shape: tuple[int, ...], dtype: np.dtype | str) -> bool:
    """True if ``path`` is a readable .npy with exactly this shape and dtype."""
    try:
        existing = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError):
        return False
    return existing.shape == tuple(shape) and existing.dtype == np.dtype(dtype)


def _run(cmd: list[str], env: dict[str, str] | None = None) -> None:
    print("  $ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env=env)


def pip_download_wheel(spec: str, dest: Path) -> Path:
    """Download the wheel for ``spec`` (no dependencies) into ``dest``; return its path."""
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
          "--disable-pip-version-check", "--quiet", spec, "-d", str(dest)])
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"expected one wheel for {spec} in {dest}, found {wheels}")
    return wheels[0]


# ---------------------------------------------------------------------------------------
# Data sets
# ---------------------------------------------------------------------------------------

IRIS_SPEC = "irispy-lmsal==0.5.0"
IRIS_MEMBER = (
    "irispy/data/test/raster/"
    "iris_l2_20140329_140938_3860258481_SJI_2796_t000_deconvolved.fits"
)


def build_iris_sji2796() -> np.ndarray:
    """IRIS slit-jaw 2796 A sequence from the irispy-lmsal 0.5.0 wheel, (72, 109, 110) f4."""
    with tempfile.TemporaryDirectory(prefix="tezip-iris-") as tmp:
        wheel = pip_download_wheel(IRIS_SPEC, Path(tmp))
        with zipfile.ZipFile(wheel) as zf:
            raw = zf.read(IRIS_MEMBER)
    data = read_fits_primary(raw)
    return np.ascontiguousarray(data, dtype=np.float32)


KS_SPEC = "py-pde==0.59.0"
KS_WORKER = Path(__file__).resolve().parent / "ks_pypde_worker.py"


def build_ks_pypde() -> np.ndarray:
    """2-D Kuramoto-Sivashinsky stack from py-pde 0.59.0, (64, 256, 256) float32.

    py-pde (and numba, scipy, ...) is pip-installed into a temporary ``--target``
    directory and run in a subprocess with only that directory on PYTHONPATH, so the
    calling environment is not modified.
    """
    with tempfile.TemporaryDirectory(prefix="tezip-ks-") as tmp:
        target = Path(tmp) / "site"
        _run([sys.executable, "-m", "pip", "install", "--only-binary=:all:",
              "--disable-pip-version-check", "--quiet", "--target", str(target), KS_SPEC])
        out = Path(tmp) / "ks.npy"
        env = dict(os.environ)
        env["PYTHONPATH"] = str(target)
        env["PYTHONNOUSERSITE"] = "1"
        env.setdefault("NUMBA_CACHE_DIR", str(Path(tmp) / "numba-cache"))
        env.setdefault("MPLBACKEND", "Agg")
        _run([sys.executable, "-s", str(KS_WORKER), str(out)], env=env)
        data = np.load(out, allow_pickle=False)
    return np.ascontiguousarray(data, dtype=np.float32)


@dataclass(frozen=True)
class Dataset:
    name: str
    shape: tuple[int, ...]
    dtype: str
    build: Callable[[], np.ndarray]


DATASETS: dict[str, Dataset] = {
    d.name: d
    for d in (
        Dataset("iris_sji2796", (72, 109, 110), "float32", build_iris_sji2796),
        Dataset("ks_pypde", (64, 256, 256), "float32", build_ks_pypde),
    )
}
DEFAULT_NAMES = ("iris_sji2796",)


def build_one(ds: Dataset, out_dir: Path, force: bool = False) -> Path:
    path = out_dir / f"{ds.name}.npy"
    if not force and is_up_to_date(path, ds.shape, ds.dtype):
        print(f"{ds.name}: up to date ({path})")
        return path
    print(f"{ds.name}: building ...", flush=True)
    t0 = time.perf_counter()
    arr = ds.build()
    if arr.shape != ds.shape or arr.dtype != np.dtype(ds.dtype):
        raise RuntimeError(
            f"{ds.name}: got {arr.shape} {arr.dtype}, expected {ds.shape} {ds.dtype}"
        )
    atomic_save_npy(path, arr)
    dt = time.perf_counter() - t0
    print(
        f"{ds.name}: wrote {path} shape={arr.shape} dtype={arr.dtype} "
        f"min={float(arr.min()):.6g} max={float(arr.max()):.6g} ({dt:.1f} s)"
    )
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"data sets to build: {', '.join(DATASETS)} "
                             f"(default: {' '.join(DEFAULT_NAMES)})")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"output directory (default: {DEFAULT_OUT})")
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = parser.parse_args(argv)
    names = args.names or list(DEFAULT_NAMES)
    unknown = [n for n in names if n not in DATASETS]
    if unknown:
        parser.error(f"unknown data set(s): {', '.join(unknown)}; known: {', '.join(DATASETS)}")
    failed: list[str] = []
    for name in names:
        try:
            build_one(DATASETS[name], args.out, force=args.force)
        except (subprocess.CalledProcessError, RuntimeError, OSError, ValueError) as exc:
            print(f"{name}: FAILED: {exc}", file=sys.stderr)
            failed.append(name)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
