"""Command line: ``tezip compress | decompress | info | verify | bench``.

Errors a user can cause end as one line on stderr and a non-zero exit (1: tezip error,
2: usage, 3: internal error); set TEZIP_DEBUG=1 to see a traceback instead.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import click
import numpy as np

from . import __version__, io, make_bound, predictors
from .atomic import check_target, temp_name
from .codec import Options, TezFile, compress_stack
from .errors import InputError, OptionError, TezipError
from .io import hdf5_tree
from .metrics import compare_stacks


class _NoBar:
    """What ``_bar`` gives where no bar would show: tqdm stays unimported (about 40 ms of a
    command's start-up here)."""

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, n: float = 1) -> None:
        return None


def _bar(total: int, desc: str, unit: str = "frame") -> Any:
    """A progress bar on stderr where it is a terminal, or with TEZIP_PROGRESS set."""
    forced = bool(os.environ.get("TEZIP_PROGRESS"))
    try:
        tty = sys.stderr.isatty()
    except (AttributeError, ValueError):        # replaced or closed
        tty = False
    if not (forced or tty):
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False,
                disable=None if not forced else False)


def _strict(obj: Any) -> Any:
    """``obj`` with every non-finite float replaced by None, so that the JSON we print is
    strict JSON (no NaN / Infinity, which many parsers reject)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_strict(v) for v in obj]
    return obj


def _echo_json(obj: Any) -> None:
    click.echo(json.dumps(_strict(obj), indent=2, allow_nan=False))


def _model(model: Path | None) -> str | None:
    """--model: a model file, or the directory 'tezip train --out' wrote (its
    model.safetensors)."""
    if model is None:
        return None
    if model.is_dir():
        inner = model / "model.safetensors"
        if inner.is_file():
            return str(inner)
        raise InputError(f"--model {model} is a directory without a model.safetensors in it; "
                         "give the model file (.safetensors from 'tezip train')")
    if not model.exists():
        raise InputError(f"--model {model}: no such file")
    return str(model)


def _mb(n: float) -> str:
    return f"{n / 1e6:.2f} MB"


class _Group(click.Group):
    """Commands that need torch (``train``) are imported only when invoked, so the classical
    commands start without loading torch."""

    lazy = {"train": "tezip.train:train_cmd"}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.lazy])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy:
            import importlib

            module, _, attr = self.lazy[name].partition(":")
            try:
                return getattr(importlib.import_module(module), attr)
            except ImportError as exc:
                raise OptionError(f"'tezip {name}' needs PyTorch ({exc.name} is not "
                                  "installed): pip install torch safetensors") from None
        return super().get_command(ctx, name)


WINDOW_HELP = ("frames per independently decodable window (default: 33, and for frames of "
               "fewer than 7,944 values as many more as hold 262,144 values)")
_MODEL_HELP = ("learned model file (.safetensors from 'tezip train', or the directory it "
               "wrote); default: the shipped pretrained/default.safetensors")


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tezip")
def cli() -> None:
    """Error-bounded compression of stacks of frames in time (detector stacks, time-lapse,
    simulation snapshots)."""


_MODE_HELP = ("abs: |x-x'| <= bound; rel: bound is a fraction of the value range; absrel: "
              "both --bound (abs) and --rel-bound hold; pwrel: |x-x'| <= bound*|x|; lossless: "
              "bit-exact. Default: rel if --bound is given, else lossless.")


@cli.command()
@click.argument("input", type=click.Path(path_type=Path))
@click.argument("output", type=click.Path(path_type=Path))
@click.option("--mode", type=click.Choice(["abs", "rel", "absrel", "pwrel", "lossless"]),
              help=_MODE_HELP)
@click.option("--bound", type=float, help="error bound (see --mode)")
@click.option("--rel-bound", type=float, help="relative bound for --mode absrel")
@click.option("--predictor", default="auto", show_default=True,
              help="auto (the classical predictor and settings, or the wavelet, that code "
                   "the first window smallest, and per window the learned one where a model "
                   "is at hand and it codes smaller), classical, learned, wavelet, or one "
                   "of: " + ", ".join(predictors.CLASSICAL_CANDIDATES))
@click.option("--adapt", is_flag=True,
              help="fit the learned forecaster to this data (needs PyTorch) and store it in "
                   "the output, which then decodes anywhere")
@click.option("--adapt-seconds", default=30.0, show_default=True, type=float,
              help="time budget of --adapt")
@click.option("--min-decode-mbps", type=float,
              help="use the learned predictor only where decoding it runs at least this fast "
                   "(MB/s, one core; default 5)")
@click.option("--threads", type=click.IntRange(min=1),
              help="windows coded in parallel (default: one thread per CPU)")
@click.option("--window", type=int, help=WINDOW_HELP
              + "; a last window of fewer than half as many joins the one before (with "
                "--threshold: at most)")
@click.option("--threshold", type=float,
              help="dynamic windows: start a new keyframe where the mean frame-to-frame change "
                   "exceeds this fraction of the value range (scene cuts, resets)")
@click.option("--dataset", help="dataset path inside an HDF5 input (e.g. /entry/data/data)")
@click.option("--format", "fmt", type=click.Choice(["npy", "hdf5", "tiff", "folder"]),
              help="input format (default: from the extension)")
@click.option("--model", type=click.Path(path_type=Path), help=_MODEL_HELP)
@click.option("--data-only", is_flag=True,
              help="HDF5 input: keep only the dataset and its attributes, not the rest of the "
                   "file (other groups, datasets, attributes, links)")
@click.option("--force", is_flag=True, help="overwrite OUTPUT if it exists")
@click.option("--json", "as_json", is_flag=True, help="print the summary as JSON")
def compress(input: Path, output: Path, mode: str | None, bound: float | None,
             rel_bound: float | None, predictor: str, adapt: bool, adapt_seconds: float,
             min_decode_mbps: float | None, threads: int | None, window: int | None,
             threshold: float | None,
             dataset: str | None, fmt: str | None, model: Path | None, data_only: bool,
             force: bool, as_json: bool) -> None:
    """Compress INPUT (.npy, HDF5, multi-page TIFF, or a folder of PNG/TIFF frames) into
    OUTPUT.tez, or into OUTPUT.h5 / .nxs.

    From an HDF5 / NeXus file, the .tez also keeps the rest of the file (groups, other
    datasets, attributes, links) unless --data-only; decompressing to .h5 then gives back
    an equivalent file with the stack in place. An .h5/.nxs/.hdf5 OUTPUT is that HDF5 file
    itself, its stack replaced by the compressed stream (a uint8 dataset that keeps the
    stack's attributes): the metadata stays readable by any HDF5 tool, and tezip
    decompress / info / verify read the file directly."""
    if mode is None:
        mode = "rel" if bound is not None else "lossless"
    if mode == "absrel" and rel_bound is None:
        raise OptionError("mode 'absrel' needs both --bound (absolute) and --rel-bound")
    if mode != "absrel" and rel_bound is not None:
        raise OptionError("--rel-bound is only for --mode absrel")
    opts = Options(make_bound(mode, bound, rel_bound), predictor=predictor, window=window,
                   model=_model(model), threshold=threshold, threads=threads, adapt=adapt,
                   adapt_seconds=adapt_seconds, min_decode_mbps=min_decode_mbps)
    check_target(output, force=force)       # before reading anything
    suffix = output.suffix.lower()
    if suffix not in (".tez", *_HDF5_SUFFIXES):
        raise OptionError(f"{output}: compress writes a .tez file, or an HDF5 file "
                          f"({', '.join(_HDF5_SUFFIXES)}) with the compressed stream inside; "
                          "give the output one of those extensions")
    _notes(opts.notes())                    # e.g. --adapt with --mode pwrel: nothing to fit
    embed = suffix in _HDF5_SUFFIXES
    with io.open_input(input, dataset=dataset, format=fmt, keep_file=not data_only) as stack, \
            _bar(stack.shape[0], "compress") as bar:
        t = time.perf_counter()
        if embed:
            stats, notes = _compress_into_hdf5(stack, output, opts, bar.update, force)
        else:
            stats = compress_stack(stack, output, opts, force=force, progress=bar.update,
                                   lean=True)
            notes = []
        dt = time.perf_counter() - t
        _notes([*stack.notes, *notes] if hasattr(stack, "notes") else notes)
    summary = {"input": str(input), "output": str(output), "shape": list(stack.shape),
               "dtype": str(stack.dtype), "mode": mode, "bound": bound, "rel_bound": rel_bound,
               "raw_bytes": stats.raw_bytes, "compressed_bytes": stats.compressed_bytes,
               "ratio": stats.ratio, "seconds": dt, "mb_per_s": stats.raw_bytes / 1e6 / dt,
               "windows": stats.windows, "predictors": stats.predictors}
    if as_json:
        _echo_json(summary)
        return
    used = ", ".join(f"{k} x{v}" for k, v in sorted(stats.predictors.items()))
    click.echo(f"{input} -> {output}: {_mb(stats.raw_bytes)} -> {_mb(stats.compressed_bytes)}, "
               f"ratio {stats.ratio:.2f}, {summary['mb_per_s']:.1f} MB/s "
               f"({stats.windows} window{'s' if stats.windows != 1 else ''}: {used})")


@cli.command()
@click.argument("input", type=click.Path(path_type=Path))
@click.argument("output", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["npy", "hdf5", "tiff", "folder"]),
              help="output format (default: from the extension)")
@click.option("--dataset", help="dataset path for an HDF5 output (default: the original's)")
@click.option("--model", type=click.Path(path_type=Path), help=_MODEL_HELP)
@click.option("--threads", type=click.IntRange(min=1),
              help="windows decoded in parallel (default: one thread per CPU)")
@click.option("--force", is_flag=True, help="overwrite OUTPUT if it exists")
def decompress(input: Path, output: Path, fmt: str | None, dataset: str | None,
               model: Path | None, threads: int | None, force: bool) -> None:
    """Decompress INPUT.tez into OUTPUT (format from the extension or --format)."""
    with TezFile(input, model=_model(model), threads=threads) as f:
        meta = dict(f.metadata)
        with io.open_output(output, f.shape, f.dtype, metadata=meta, format=fmt,
                            dataset=dataset, force=force) as w, _bar(len(f), "decompress") as bar:
            t = time.perf_counter()
            for t0, frames in f.iter_windows():
                w.write(t0, frames)
                bar.update(len(frames))
        dt = time.perf_counter() - t
        _notes(w.notes)             # after the output is in place: a failure is one line
        raw = math.prod(f.shape) * f.dtype.itemsize
        click.echo(f"{input} -> {output}: {_mb(raw)} {f.dtype} {tuple(f.shape)}, "
                   f"{raw / 1e6 / dt:.1f} MB/s")


@cli.command()
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="print as JSON")
def info(file: Path, as_json: bool) -> None:
    """Describe a .tez file: shape, dtype, bound, windows, ratio."""
    with TezFile(file) as f:
        h = f.header
        raw = math.prod(f.shape) * f.dtype.itemsize
        used: dict[str, int] = {}
        seconds = 0.0                       # expected decoding time on one core
        for i, (t0, t1) in enumerate(f.window_frames()):
            meta = f.window_meta(i)
            name = meta["p"]
            # a Lorenzo window with a second stage (format v4) as "lorenzo+stage", an
            # interpolation extrapolating linearly at edges (v5) as "interp+edge"
            cfg = meta.get("cfg") or {}
            label = name + ("+stage" if "w" in cfg else "+edge" if cfg.get("edge") else "")
            used[label] = used.get(label, 0) + 1
            seconds += (t1 - t0) * math.prod(f.shape[1:]) * f.dtype.itemsize / 1e6 \
                / _decode_mbps(name, h.get("model"), f)
        model = h.get("model")
        if isinstance(model, dict):
            model = {**model, "stored_in_file": f.model_stored}
        out = {"file": str(file), "format_version": h["format_version"],
               "written_by": h.get("tezip"), "shape": list(f.shape), "dtype": f.dtype.name,
               "bound": h["bound"], "quantizer": h["quant"], "predictor": h["predictor"],
               "window": f.window, "windows": f.n_windows, "window_predictors": used,
               "model": model, "expected_decode_mb_per_s": raw / 1e6 / seconds if seconds else None,
               "raw_bytes": raw, "compressed_bytes": f.compressed_bytes,
               "ratio": raw / f.compressed_bytes, "value_range": h.get("value_range"),
               "metadata": _public_metadata(f.metadata)}
    if as_json:
        _echo_json(out)
        return
    b = out["bound"]
    bound = ", ".join(f"{k}={b[k]}" for k in ("abs", "rel", "pw") if b.get(k) is not None)
    lines = [
        f"file       {file} (format v{out['format_version']}, tezip {out['written_by']})",
        f"stack      {tuple(f.shape)} {f.dtype.name}, {_mb(raw)}",
        f"bound      {b['mode']}{' ' + bound if bound else ''} (enforced: {h['quant']['kind']}"
        f" grid, step {h['quant']['step']:.6g})",
        f"size       {_mb(f.compressed_bytes)}, ratio {out['ratio']:.2f}",
        f"windows    {f.n_windows} of up to {f.window} frames; predictors "
        + ", ".join(f"{k} x{v}" for k, v in sorted(used.items())),
    ]
    if isinstance(model, dict):
        if not any(_is_learned(k) for k in used):
            where = "not used by any window, not stored"
        elif model["stored_in_file"]:
            where = "stored in the file"
        else:
            where = "named only (a shipped model, or give it with --model)"
        size = [f"{model['params']} parameters"] if model.get("params") is not None else []
        if model.get("macs_per_pixel") is not None:
            size.append(f"{model['macs_per_pixel']:.0f} multiply-adds per pixel")
        # (format v1 records name only the model's file and hash)
        lines.append(f"model      {model['hash'][:16]}: "
                     f"{', '.join(size) if size else 'size not recorded'}; {where}")
    if out["expected_decode_mb_per_s"]:
        lines.append(f"decoding   about {out['expected_decode_mb_per_s']:.0f} MB/s per core "
                     "(an estimate from the predictors used)")
    if f.metadata.get("source"):
        lines.append(f"source     {f.metadata['source']}")
    tree = out["metadata"].get(hdf5_tree.KEY)
    if tree:
        lines.append(f"hdf5 file  rest of the file kept ({_mb(tree['skeleton_bytes'])}); "
                     f"stack at {tree.get('path')}")
    click.echo("\n".join(lines))


def _is_learned(name: str) -> bool:
    """Whether a window's predictor name is the learned one's (``prednet+...`` in format
    v1 files)."""
    return name == "learned" or name.startswith("prednet")


def _decode_mbps(name: str, model: Any, f: Any) -> float:
    from .codec import classical_decode_mbps, learned_decode_mbps

    if _is_learned(name) and isinstance(model, dict):
        channels = f.shape[3] if len(f.shape) == 4 else 1
        return learned_decode_mbps(float(model.get("macs_per_pixel") or 0), channels,
                                   f.dtype.itemsize, math.prod(f.shape[1:]))
    return classical_decode_mbps(f.dtype.itemsize, name)


_HDF5_SUFFIXES = (".h5", ".hdf5", ".nxs", ".hdf")


def _compress_into_hdf5(stack: Any, output: Path, opts: Options, progress: Any,
                        force: bool) -> Any:
    """OUTPUT.h5: the input file's groups, datasets and attributes, with the stack replaced
    by a uint8 dataset holding the .tez stream (read in place by decompress, info, verify,
    tezip.open). Written under temporary names, renamed when complete."""
    with io.atomic_output(output, force=force) as h5:
        tez = Path(temp_name(output))                    # scratch: the stream to embed
        try:
            stats = compress_stack(stack, tez, opts, force=True, progress=progress,
                                   lean=True)
            meta = stack.metadata or {}
            notes = hdf5_tree.embed(str(tez), h5, meta.get(hdf5_tree.KEY),
                                    meta.get("dataset") or "/data", meta.get("attrs") or {},
                                    tuple(stack.shape), np.dtype(stack.dtype).name)
        finally:
            tez.unlink(missing_ok=True)
    stats.compressed_bytes = output.stat().st_size
    return stats, [n.replace(h5, str(output)) for n in notes]


def _notes(notes: list[str]) -> None:
    """What an output does not keep, one 'tezip: note:' line each on stderr."""
    for n in notes:
        click.echo(f"tezip: note: {n}", err=True)


def _public_metadata(meta: dict) -> dict:
    """Metadata as shown to a user: the HDF5 file skeleton summarized, not dumped."""
    if hdf5_tree.KEY not in meta:
        return meta
    return {**meta, hdf5_tree.KEY: hdf5_tree.summary(meta[hdf5_tree.KEY])}


@cli.command()
@click.argument("original", type=click.Path(path_type=Path))
@click.argument("file", type=click.Path(path_type=Path), required=False)
@click.option("--dataset", help="dataset path inside an HDF5 original")
@click.option("--format", "fmt", type=click.Choice(["npy", "hdf5", "tiff", "folder"]),
              help="format of ORIGINAL (default: from the extension)")
@click.option("--no-ssim", is_flag=True, help="skip SSIM (slow on large stacks)")
@click.option("--model", type=click.Path(path_type=Path), help=_MODEL_HELP)
@click.option("--json", "as_json", is_flag=True, help="print as JSON")
def verify(original: Path, file: Path | None, dataset: str | None, fmt: str | None,
           no_ssim: bool, model: Path | None, as_json: bool) -> None:
    """Compare FILE.tez with ORIGINAL: errors, PSNR, SSIM, ratio; exit 1 if the recorded
    error bound does not hold.

    With one argument, a data set directory written by `tezip prepare`: check every shard
    against manifest.json (present, size, sha256, shape); exit 1 listing the missing or
    damaged ones."""
    if file is None:
        _verify_dataset(original, as_json)
        return
    if original.suffix.lower() == ".tez" and fmt is None:
        raise click.UsageError(f"verify takes ORIGINAL first, then FILE.tez; {original} "
                               f"is a .tez file" + (f": give {file} before it"
                                                    if file.suffix.lower() != ".tez" else ""))
    with io.open_input(original, dataset=dataset, format=fmt) as stack, \
            TezFile(file, model=_model(model)) as f:
        if tuple(stack.shape) != tuple(f.shape) or np.dtype(stack.dtype) != f.dtype:
            raise InputError(f"{original} is {tuple(stack.shape)} {np.dtype(stack.dtype)} but "
                             f"{file} holds {tuple(f.shape)} {f.dtype}; not the same stack")
        with _bar(len(f), "verify") as bar:
            report = compare_stacks(stack, f, ssim=not no_ssim, progress=bar.update)
    if as_json:
        _echo_json(report)
    else:
        def fmt_num(v: Any) -> str:
            return "n/a" if v is None else f"{v:.6g}"

        # an exact reconstruction has no finite PSNR ("n/a dB" read as a failure)
        psnr = ("inf (identical)" if report["identical"] else
                "n/a" if report["psnr"] is None else f"{report['psnr']:.6g} dB")
        click.echo(
            f"max abs error {fmt_num(report['max_abs_error'])}, max rel error "
            f"{fmt_num(report['max_rel_error'])}, PSNR {psnr}, SSIM "
            f"{fmt_num(report['ssim'])}, ratio {report['ratio']:.2f}; bound "
            f"{report['bound_mode']}: {'OK' if report['ok'] else 'VIOLATED'}"
            + (f" ({report['violations']} values)" if not report["ok"] else ""))
    if not report["ok"]:
        sys.exit(1)


def _verify_dataset(directory: Path, as_json: bool) -> None:
    from . import parallel

    if not parallel.is_dataset_dir(directory):
        if directory.is_dir():
            raise InputError(f"{directory} has no {parallel.MANIFEST}; verify a data set "
                             "written by `tezip prepare`, or give ORIGINAL and FILE.tez")
        raise click.UsageError("verify takes ORIGINAL FILE.tez, or one data set directory")
    n = len(parallel.load_manifest(directory)["shards"])
    with _bar(n, "verify", unit="shard") as bar:
        rep = parallel.verify_dataset(directory, progress=bar.update)
    if as_json:
        _echo_json(rep.to_dict())
    else:
        for name, problem in rep.problems:
            click.echo(f"{name}: {problem}")
        if rep.passed:
            click.echo(f"{directory}: {rep.shards} shards OK ({rep.frames} frames, "
                       f"{_mb(rep.bytes)})")
        else:
            click.echo(f"{directory}: {len(rep.problems)} problem(s); {rep.ok} of "
                       f"{rep.shards} shards OK")
    if not rep.passed:
        sys.exit(1)


@cli.command()
@click.argument("inputs", nargs=-1, required=True)
@click.option("--out", "out", required=True, type=click.Path(path_type=Path),
              help="data set directory (created; shards + manifest.json)")
@click.option("--mode", type=click.Choice(["abs", "rel", "absrel", "pwrel", "lossless"]),
              help=_MODE_HELP)
@click.option("--bound", type=float, help="error bound (see --mode)")
@click.option("--rel-bound", type=float, help="relative bound for --mode absrel")
@click.option("--predictor", default="auto", show_default=True,
              help="auto (the classical predictor and settings, or the wavelet, that code "
                   "the first window smallest, and per window the learned one where a model "
                   "is at hand and it codes smaller), classical, learned, wavelet, or one "
                   "of: " + ", ".join(predictors.CLASSICAL_CANDIDATES))
@click.option("--window", type=int, help=WINDOW_HELP)
@click.option("--dataset", help="dataset path inside HDF5 inputs (or give FILE.h5:/path)")
@click.option("--shard-size", default=128.0, show_default=True, type=float,
              help="target compressed size of one shard, in MB")
@click.option("--model", type=click.Path(path_type=Path), help=_MODEL_HELP)
@click.option("--adapt", is_flag=True,
              help="fit one learned forecaster to the whole data set, data-parallel over "
                   "the ranks (needs PyTorch); saved once in --out and listed in the "
                   "manifest; windows use it where it codes smaller")
@click.option("--adapt-seconds", default=60.0, show_default=True, type=float,
              help="time budget of --adapt")
@click.option("--min-decode-mbps", type=float,
              help="use the learned predictor only where it decodes at least this fast (MB/s "
                   "per core; default 100, so that loaders keep up with training)")
@click.option("--force", is_flag=True, help="rewrite every shard instead of resuming")
@click.option("--quiet", is_flag=True, help="no progress line")
@click.option("--json", "as_json", is_flag=True, help="print the summary as JSON")
def prepare(inputs: tuple[str, ...], out: Path, mode: str | None, bound: float | None,
            rel_bound: float | None, predictor: str, window: int | None, dataset: str | None,
            shard_size: float, model: Path | None, adapt: bool, adapt_seconds: float,
            min_decode_mbps: float | None, force: bool, quiet: bool, as_json: bool) -> None:
    """Compress INPUTS (files, quoted globs, folders, FILE.h5:/dataset) into .tez shards
    and a manifest.json in --out, over MPI ranks when started by mpirun/mpiexec/srun
    (`pip install tezip[mpi]`); one rank otherwise. A rerun resumes: shards already
    complete and verified are kept."""
    from . import parallel

    comm = parallel.get_comm()
    try:
        codec = parallel.CodecConfig.from_cli(mode, bound, rel_bound, predictor, window,
                                              _model(model), min_decode_mbps)
        cfg = parallel.PrepareConfig(tuple(inputs), out, codec, dataset=dataset,
                                     shard_size_mb=shard_size, force=force,
                                     progress=not quiet and not as_json, adapt=adapt,
                                     adapt_seconds=adapt_seconds)
        result = parallel.prepare(cfg, comm)
    except TezipError as exc:
        if comm.rank != 0 or (isinstance(exc, parallel.RankFailure) and not exc.report):
            sys.exit(1)  # rank 0 tells the user
        raise
    if comm.rank != 0:
        return
    s = result.summary()
    if as_json:
        _echo_json(s)
        return
    ratio = f"{s['ratio']:.2f}" if s["ratio"] else "-"
    speed = f"{s['mb_per_s']:.1f} MB/s" if s["mb_per_s"] else "nothing to encode"
    click.echo(f"{s['manifest']}: {s['shards']} shards ({s['shards_written']} written, "
               f"{s['shards_reused']} reused) from {s['sources']} sources, {s['frames']} "
               f"frames, {_mb(s['raw_bytes'])} -> {_mb(s['compressed_bytes'])}, ratio {ratio}, "
               f"{speed}, {s['ranks']} rank{'s' if s['ranks'] > 1 else ''}, "
               f"{s['seconds']:.2f} s")


@cli.command()
@click.argument("data", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--bounds", default="1e-2,1e-3,1e-4,lossless", show_default=True,
              help="comma-separated relative bounds; 'lossless' for lossless")
@click.option("--predictors", "preds", default="auto", show_default=True,
              help="comma-separated tezip rows: auto, classical, learned, a predictor's name, "
                   "or adapt (auto with --adapt); a suffix @N runs N threads (default one "
                   "core, like the other codecs)")
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(min=1),
              help="best of N timings")
@click.option("--codecs", default="all", show_default=True,
              help="comma-separated other codecs: sz3, zfp, sperr, zstd, blosc2, jpegxl, "
                   "jpegls, ffv1, x265 (missing ones are skipped with a note)")
@click.option("--json", "json_out", type=click.Path(path_type=Path), help="also write JSON here")
@click.option("--md", "md_out", type=click.Path(path_type=Path),
              help="also write the markdown here")
@click.option("--plot", "plot_out", type=click.Path(path_type=Path),
              help="draw rate-distortion curves (ratio vs PSNR and vs bound) into this PNG "
                   "(needs matplotlib)")
@click.option("--quiet", "-q", is_flag=True, help="no progress lines on stderr")
def bench(data: tuple[Path, ...], bounds: str, preds: str, repeat: int, codecs: str,
          json_out: Path | None, md_out: Path | None, plot_out: Path | None,
          quiet: bool) -> None:
    """Ratio, PSNR and MB/s of tezip against SZ3, ZFP, SPERR, zstd, blosc2, JPEG-XL,
    JPEG-LS, FFV1 and x265 on .npy stacks, in one run."""
    from . import bench as b

    if plot_out is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise click.UsageError("--plot needs matplotlib (pip install 'tezip[bench]')") \
                from None
    try:
        blist = [None if s.strip() == "lossless" else float(s) for s in bounds.split(",")]
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--bounds") from None
    fams = None if codecs.strip() in ("all", "") else codecs.split(",")
    try:
        b._families(fams)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--codecs") from None
    t0 = time.perf_counter()

    def progress(msg: str) -> None:
        click.echo(f"[{time.perf_counter() - t0:7.1f} s] {msg}", err=True)

    rows = b.run([str(p) for p in data], bounds=blist,
                 predictors=tuple(s.strip() for s in preds.split(",")), repeat=repeat,
                 progress=None if quiet else progress, codecs=fams)
    md = b.to_markdown(rows)
    click.echo(md)
    if md_out:
        _write_atomically(md_out, md)
    if json_out:
        _write_atomically(json_out, b.to_json(rows))
    if plot_out:
        from .bench_plot import plot_rd

        plot_rd(rows, plot_out)
        if not quiet:
            click.echo(f"plot written to {plot_out}", err=True)
    failed = b.failed_tezip_rows(rows)
    if failed:
        # a tezip row that broke its bound, was not bit-exact or failed is a defect of this
        # build: the tables are written, and the run says so in its exit status
        click.echo(f"tezip: error: {len(failed)} tezip row(s) failed: "
                   + "; ".join(f"{r['dataset']} {r['bound']} {r['codec']}: {r['note']}"
                               for r in failed), err=True)
        sys.exit(1)


def _write_atomically(path: Path, text: str) -> None:
    with io.atomic_output(path, force=True) as tmp:    # results files are rewritten
        Path(tmp).write_text(text)


def _compiling_notice() -> None:
    # shown where the progress bars are: on a terminal, or with TEZIP_PROGRESS set (scripts
    # reading stderr get only errors)
    if sys.stderr.isatty() or os.environ.get("TEZIP_PROGRESS"):
        click.echo("tezip: compiling kernels for this kind of data (first use on this "
                   "machine, cached afterwards; this can take a minute)", err=True)


def console_main() -> int:
    """The ``tezip`` program (its console script, ``python -m tezip``): ``main`` in a
    process of its own, which runs no numba code but tezip's, so numba's first use there
    skips its probe for BLAS (``kernels.skip_blas_probe``) and loads kernels from its disk
    cache without building its compiler's tables (``kernels.fast_cache_load``). ``main``
    called from a program leaves numba as it is."""
    from . import kernels

    kernels.skip_blas_probe = True
    kernels.fast_cache_load = True
    return main()


def _memory_hint(argv: list[str] | None) -> str:
    """What to try on the command that ran out of memory: a window is what one thread
    holds; only the coding commands choose it."""
    args = sys.argv[1:] if argv is None else argv
    command = next((a for a in args if not a.startswith("-")), "")
    if command == "compress":
        return "; use a smaller --window, or fewer --threads"
    if command == "prepare":
        return "; use a smaller --window"
    if command == "decompress":
        return "; use fewer --threads (the file's windows were set when it was coded)"
    return ""


def main(argv: list[str] | None = None) -> int:
    debug = bool(os.environ.get("TEZIP_DEBUG"))
    from . import kernels  # no numba import: just where the notice is set

    kernels.on_slow_compile = _compiling_notice
    try:
        cli.main(args=argv, prog_name="tezip", standalone_mode=False)
    except TezipError as exc:
        if debug:
            raise
        click.echo(f"tezip: error: {exc}", err=True)
        return 1
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        click.echo(f"tezip: error: {exc.format_message()} (see tezip --help)", err=True)
        return 2
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("tezip: interrupted", err=True)
        return 130
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1
    except OSError as exc:
        if debug:
            raise
        where = f": {exc.filename}" if exc.filename else ""
        click.echo(f"tezip: error: {exc.strerror or exc}{where}", err=True)
        return 1
    except MemoryError:
        click.echo(f"tezip: error: out of memory{_memory_hint(argv)}", err=True)
        return 1
    except Exception as exc:  # a bug: still one line, the traceback on demand
        if debug:
            raise
        if isinstance(exc, RuntimeError) and "can't start new thread" in str(exc):
            # what a thread pool meets under a memory limit
            click.echo(f"tezip: error: no thread could be started (out of memory?)"
                       f"{_memory_hint(argv)}", err=True)
            return 1
        click.echo(f"tezip: internal error: {type(exc).__name__}: {exc} "
                   "(set TEZIP_DEBUG=1 for a traceback and please report it)", err=True)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
