"""``kernels.inline_copy``: numba's inliner copies a callee's blocks with one memo, and the
machine code it compiles is the same as without it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tezip.kernels import inline_copy

# a kernel with inlined helpers of several blocks each (loops, branches), called at
# several sites: what the inliner copies
KERNEL = textwrap.dedent("""
    import sys
    import numba
    import numpy as np
    from tezip.kernels import inline_copy

    if sys.argv[1] == "on":
        assert inline_copy.install()

    @numba.njit(inline="always")
    def clamp(v, lo, hi):
        if v < lo:
            return lo
        if v > hi:
            return hi
        return v

    @numba.njit(inline="always")
    def run(x, i, lo, hi):
        s = 0.0
        for j in range(i, min(i + 4, x.size)):
            if x[j] != x[j]:
                continue
            s += clamp(x[j], lo, hi)
        return s

    @numba.njit
    def kernel(x, lo, hi):
        out = np.empty(x.size)
        for i in range(x.size):
            a = run(x, i, lo, hi)
            b = run(x, i, -hi, -lo) if i % 2 else clamp(a, lo, hi)
            out[i] = a - b
        return out

    x = np.linspace(-3.0, 3.0, 50)
    y = kernel(x, -1.0, 2.0)
    print(numba.core.inline_closurecall.InlineWorker.inline_ir.__dict__.get("_tezip", False))
    print(kernel.inspect_llvm(kernel.signatures[0]))
""")


def _compile(mode: str) -> tuple[bool, str]:
    env = dict(os.environ, PYTHONHASHSEED="0")   # (numba's IR names follow set order)
    env.pop("TEZIP_INLINE_COPY", None)
    r = subprocess.run([sys.executable, "-c", KERNEL, mode], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    flag, llvm = r.stdout.split("\n", 1)
    return flag == "True", llvm


def test_the_machine_code_is_numbas_own():
    on, llvm_on = _compile("on")
    off, llvm_off = _compile("off")
    assert on and not off
    assert "define" in llvm_on
    assert llvm_on == llvm_off


def _blocks():
    from numba.core import compiler

    def f(x, n):
        s = 0
        for i in range(n):
            if x[i] > 0:
                s += x[i]
            else:
                s -= 1
        return s

    ir = compiler.run_frontend(f)
    blocks = list(ir.blocks.values())
    assert len(blocks) > 3
    scope = blocks[0].scope
    assert all(b.scope is scope for b in blocks)
    return blocks, scope


def test_blocks_of_one_inlining_share_one_copy_of_their_scope():
    blocks, scope = _blocks()
    if not inline_copy.install():
        pytest.skip("numba's inliner has another shape here")
    from numba.core import inline_closurecall as icc

    inline_copy._STATE.memos = {}
    try:
        copies = [icc.copy.deepcopy(b) for b in blocks]
    finally:
        inline_copy._STATE.memos = None
    scopes = {id(c.scope) for c in copies}
    assert len(scopes) == 1 and copies[0].scope is not scope
    assert copies[0].scope == scope             # a copy, equal to the original
    # every variable of the copies is its own object in the one copied scope
    names = 0
    for c, b in zip(copies, blocks, strict=True):
        assert c is not b and len(c.body) == len(b.body)
        for stmt in c.body:
            for v in stmt.list_vars():
                assert v.scope is copies[0].scope
                names += 1
    assert names > 0
    # outside an inlining, each block is copied with a memo of its own, as before
    apart = [icc.copy.deepcopy(b) for b in blocks]
    assert len({id(c.scope) for c in apart}) == len(blocks)


def test_install_is_switched_off_by_the_environment():
    code = ("from tezip.kernels import inline_copy; import numba.core.inline_closurecall as i;"
            "print(inline_copy.install(), i.copy.__class__.__name__)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, TEZIP_INLINE_COPY="0"), timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "module"]


def test_the_first_compile_of_a_kernel_installs_it(tmp_path):
    script = tmp_path / "first.py"
    script.write_text(textwrap.dedent("""
        import sys
        from tezip.kernels import inline_copy
        from tezip.kernels.core import jit

        @jit
        def kernel(x):
            return x + 1

        assert not inline_copy._installed
        assert "numba.core.inline_closurecall" not in sys.modules
        assert kernel(1) == 2
        print(inline_copy._installed)
    """))
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))   # (a compile)
    env.pop("TEZIP_INLINE_COPY", None)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "True"
