"""Every output goes through one helper (tezip.atomic): non-regular targets refused even
with --force, a temporary name that fits NAME_MAX, no-replace rename without --force, the
format an output's name says, and a full disk or a file size limit ending in one line
with no temporary file left (issue 14, items 1, 2, 5, 9, 12)."""

from __future__ import annotations

import os
import resource
import signal
import socket
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from exact import check_bound

import tezip
from tezip.cli import main
from tezip.io import open_output

TEZ_FORMATS = ["a.npy", "a.h5", "a.tif", "frames"]


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("outputs")
    a = np.random.default_rng(0).normal(size=(40, 64, 64)).astype(np.float32)  # 0.66 MB
    np.save(d / "a.npy", a)
    (d / "a.tez").write_bytes(tezip.compress(a, mode="abs", bound=1e-2, predictor="classical"))
    return d


def one_line(capsys, rc, code=1, *words):
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == code, err
    assert len(lines) == 1 and lines[0].startswith("tezip: error: "), err
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def listing(d: Path) -> list[str]:
    return sorted(os.listdir(d))


# ---------------------------------------------------------------------------------------
# item 1: outputs that exist and are not regular files


def special_files(d: Path) -> dict[str, Path]:
    out = {"dir": d / "adir", "fifo": d / "afifo"}
    out["dir"].mkdir()
    os.mkfifo(out["fifo"])
    sock = d / "asock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock))
    s.close()
    out["socket"] = sock
    if os.geteuid() == 0:
        dev = d / "anull"
        os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 3))   # a /dev/null of our own
        out["device"] = dev
    return out


@pytest.mark.parametrize("force", [False, True])
def test_non_regular_outputs_are_refused_even_with_force(src, tmp_path, capsys, force):
    targets = special_files(tmp_path)
    kinds = {p: os.lstat(p).st_mode for p in targets.values()}
    extra = ["--force"] if force else []
    for kind, target in targets.items():
        for ext in (".tez", ".h5"):
            link = tmp_path / f"{kind}{ext}"
            os.rename(target, link)
            rc = main(["compress", str(src / "a.npy"), str(link), "--bound", "1e-2", *extra])
            one_line(capsys, rc, 1, str(link), "not")
            os.rename(link, target)
        for ext in (".npy", ".h5", ".tif"):
            link = tmp_path / f"{kind}{ext}"
            os.rename(target, link)
            rc = main(["decompress", str(src / "a.tez"), str(link), *extra])
            one_line(capsys, rc, 1, str(link))
            os.rename(link, target)
    for p, mode in kinds.items():
        assert os.lstat(p).st_mode == mode, p              # still what it was
    assert not [n for n in listing(tmp_path) if ".tmp" in n]


def test_helper_refuses_special_files(tmp_path):
    from tezip.atomic import atomic_output

    for target in special_files(tmp_path).values():
        for force in (False, True):
            with pytest.raises(tezip.OutputExistsError, match="not a regular file"), \
                    atomic_output(target, force=force) as tmp:
                Path(tmp).write_text("x")
    assert not [n for n in listing(tmp_path) if ".tmp" in n]


# ---------------------------------------------------------------------------------------
# item 5: without --force, a file that appears while writing is never replaced


def test_compress_does_not_replace_a_file_that_appeared_meanwhile(src, tmp_path):
    out = tmp_path / "out.tez"
    a = np.load(src / "a.npy")

    class Racing:             # another process creates the output while we encode
        shape, dtype, metadata = a.shape, a.dtype, {}

        def read(self, t0, t1):
            if t0 >= 8 and not out.exists():
                out.write_bytes(b"the other process's file")
            return a[t0:t1]

    opts = tezip.Options(tezip.make_bound("abs", 1e-2), predictor="lorenzo", window=8, threads=1)
    with pytest.raises(tezip.OutputExistsError, match="appeared"):
        tezip.codec.compress_stack(Racing(), out, opts)
    assert out.read_bytes() == b"the other process's file"
    assert listing(tmp_path) == ["out.tez"]
    tezip.codec.compress_stack(Racing(), out, opts, force=True)       # --force replaces
    check_bound(a, tezip.decompress(out), "abs", 1e-2)


@pytest.mark.parametrize("name", TEZ_FORMATS)
def test_decompress_does_not_replace_a_file_that_appeared_meanwhile(tmp_path, name):
    out = tmp_path / name
    w = open_output(out, (3, 4, 5), "uint16")
    w.write(0, np.ones((3, 4, 5), np.uint16))
    if name == "frames":
        out.mkdir()
    else:
        out.write_text("theirs")
    with pytest.raises(tezip.OutputExistsError, match="appeared"):
        w.commit()
    assert (out.is_dir() and not os.listdir(out)) if name == "frames" else \
        out.read_text() == "theirs"
    assert listing(tmp_path) == [name]


def test_two_processes_without_force_one_wins(src, tmp_path):
    """Two real `tezip compress` processes to one name: exactly one succeeds, the other
    says the output appeared or exists, and the file is a complete .tez."""
    out = tmp_path / "race.tez"
    cmd = [sys.executable, "-m", "tezip", "compress", str(src / "a.npy"), str(out),
           "--mode", "abs", "--bound", "1e-2", "--predictor", "lorenzo"]
    procs = [subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    assert sorted(rc for rc, _ in results) == [0, 1], results
    err = next(e for rc, e in results if rc == 1)
    assert "--force" in err and len(err.strip().splitlines()) == 1
    assert tezip.decompress(out).shape == (40, 64, 64)
    assert listing(tmp_path) == ["race.tez"]


# ---------------------------------------------------------------------------------------
# item 9: an output's format is what its name says, or it is refused


def test_compress_output_must_be_named_tez_or_hdf5(src, tmp_path, capsys):
    for name in ("out.tif", "out.npy", "out.png", "out"):
        rc = main(["compress", str(src / "a.npy"), str(tmp_path / name), "--bound", "1e-2"])
        one_line(capsys, rc, 1, ".tez")
    assert listing(tmp_path) == []


def test_decompress_format_follows_the_name(src, tmp_path, capsys):
    d = tmp_path / "d.h5"
    d.mkdir()
    rc = main(["decompress", str(src / "a.tez"), str(d), "--force"])
    one_line(capsys, rc, 1, "d.h5", "directory")
    assert listing(d) == []
    rc = main(["decompress", str(src / "a.tez"), "-"])
    one_line(capsys, rc, 1, "standard output")
    assert not Path("-").exists()
    rc = main(["decompress", str(src / "a.tez"), str(tmp_path / "x.npy"), "--format", "tiff"])
    one_line(capsys, rc, 1, "x.npy", "--format")
    assert listing(tmp_path) == ["d.h5"]
    assert main(["decompress", str(src / "a.tez"), str(tmp_path / "x.tif")]) == 0
    import tifffile

    assert tifffile.imread(tmp_path / "x.tif").shape == (40, 64, 64)


# ---------------------------------------------------------------------------------------
# item 12: long names; --force onto a directory


def test_long_output_names_that_the_file_system_accepts(src, tmp_path, capsys):
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    tez = tmp_path / ("t" * (limit - 4) + ".tez")
    npy = tmp_path / ("n" * (limit - 4) + ".npy")
    assert main(["compress", str(src / "a.npy"), str(tez), "--bound", "1e-2"]) == 0
    assert main(["decompress", str(tez), str(npy)]) == 0
    assert np.load(npy).shape == (40, 64, 64)
    capsys.readouterr()
    rc = main(["decompress", str(tez), str(tmp_path / ("x" * limit + ".npy"))])
    one_line(capsys, rc, 1, "name")
    assert sorted(listing(tmp_path)) == sorted([tez.name, npy.name])


def test_force_onto_a_directory_is_refused_and_leaves_nothing(src, tmp_path, capsys):
    (tmp_path / "out.npy").mkdir()
    (tmp_path / "out.tez").mkdir()
    rc = main(["decompress", str(src / "a.tez"), str(tmp_path / "out.npy"), "--force"])
    one_line(capsys, rc, 1, "directory")
    rc = main(["compress", str(src / "a.npy"), str(tmp_path / "out.tez"), "--bound", "1e-2",
               "--force"])
    one_line(capsys, rc, 1, "directory")
    assert listing(tmp_path) == ["out.npy", "out.tez"]


# ---------------------------------------------------------------------------------------
# item 2: a full disk or a file size limit: one line, exit 1, no temporary file


def run_limited(args: list[str], cwd: Path, fsize: int | None = None, precheck: bool = True):
    """``tezip ARGS`` in a child process, under ``ulimit -f`` = fsize bytes; with
    ``precheck=False`` the up-front space check is disabled, so the writers meet the
    limit while writing."""
    code = textwrap.dedent(f"""
        import sys
        import tezip.atomic
        if not {precheck}:
            tezip.atomic.check_space = lambda *a, **k: None
        from tezip.cli import main
        sys.exit(main(sys.argv[1:]))
    """)

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, resource.RLIM_INFINITY))

    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True,
                          text=True, preexec_fn=limit, timeout=300)


def assert_clean_failure(p, d: Path, before: list[str]) -> None:
    assert p.returncode == 1, (p.returncode, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tezip: error: "), p.stderr
    assert listing(d) == before, "a temporary or partial output was left behind"


# (a folder's frames are each under the limit; HDF5 cannot survive a failed write, so it
# relies on the up-front check of the limit)
@pytest.mark.parametrize("out,precheck", [("r.npy", True), ("r.npy", False), ("r.h5", True),
                                          ("r.tif", True), ("r.tif", False), ("c.tez", True),
                                          ("c.tez", False)])
def test_file_size_limit(src, tmp_path, out, precheck):
    for name in ("a.tez", "a.npy"):
        (tmp_path / name).write_bytes((src / name).read_bytes())
    before = listing(tmp_path)
    args = (["compress", "a.npy", out, "--mode", "lossless"] if out.endswith(".tez")
            else ["decompress", "a.tez", out])
    p = run_limited(args, tmp_path, fsize=100 * 1024, precheck=precheck)
    assert_clean_failure(p, tmp_path, before)
    assert "ulimit" in p.stderr or "too large" in p.stderr.lower() or "short write" in p.stderr


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MB tmpfs (needs root and permission to mount); skipped otherwise."""
    d = tmp_path / "small"
    d.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(d)],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", str(d)], check=False)


@pytest.mark.parametrize("precheck", [True, False])
def test_full_disk(src, small_disk, precheck):
    big = np.random.default_rng(1).normal(size=(80, 64, 64)).astype(np.float32)  # 1.3 MB
    tez = small_disk.parent / "big.tez"
    tez.write_bytes(tezip.compress(big, mode="abs", bound=1e-2, predictor="classical"))
    np.save(small_disk.parent / "big.npy", big)
    for out in ("r.npy", "r.h5", "r.tif", "frames"):
        p = run_limited(["decompress", str(tez), str(small_disk / out)], small_disk,
                        precheck=precheck)
        assert_clean_failure(p, small_disk, [])
        assert "MB free" in p.stderr or "No space left" in p.stderr or "short write" in p.stderr
    p = run_limited(["compress", str(small_disk.parent / "big.npy"), str(small_disk / "c.tez"),
                     "--mode", "lossless"], small_disk, precheck=precheck)
    assert_clean_failure(p, small_disk, [])
    # and what fits is still written
    assert main(["decompress", str(src / "a.tez"), str(small_disk / "ok.h5")]) == 0
    with tezip.io.open_input(small_disk / "ok.h5") as s:
        assert s.shape == (40, 64, 64)
