"""Rate-distortion figure for the rows of :mod:`tezip.bench` (needs matplotlib).

One row of panels per data set: compression ratio against PSNR, and compression ratio
against the relative bound (log axes), one line per lossy codec; the lossless results are
listed in a box in the PSNR panel, and the best lossless ratio is drawn as a dotted line in
both. Points that broke their bound are crossed out. matplotlib is imported only when a
figure is drawn, with the Agg backend (no display needed).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .bench import LOSSLESS, SPERR, SZ3, ZFP, Row
from .io import atomic_output

# codec -> (label, colour, marker, line style, line width); others get the default cycle
_STYLE: dict[str, tuple[str, str, str, str, float]] = {
    "tezip": ("tezip auto (default)", "#d62728", "o", "-", 2.6),
    "tezip-classical": ("tezip classical", "#ff7f0e", "s", "--", 1.6),
    "tezip-adapt": ("tezip auto --adapt", "#9467bd", "^", "--", 1.6),
    "tezip-learned": ("tezip learned (shipped model)", "#e377c2", "v", ":", 1.4),
    SZ3: ("SZ3 3-D", "#1f77b4", "D", "-", 1.6),
    ZFP: ("ZFP 3-D", "#2ca02c", "P", "-", 1.6),
    SPERR: ("SPERR 3-D", "#8c564b", "X", "-", 1.6),
}


def _style(codec: str) -> tuple[str, str | None, str, str, float]:
    if codec in _STYLE:
        return _STYLE[codec]
    return codec, None, "o", "-.", 1.2


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _num(x: Any) -> float | None:
    """A number from a row field (JSON rows carry "inf" as a string)."""
    if isinstance(x, str):
        try:
            return float(x)
        except ValueError:
            return None
    return float(x) if isinstance(x, (int, float)) else None


def plot_rd(rows: list[Row], out: str | Path, title: str | None = None) -> Path:
    """Draw the rate-distortion figure for ``rows`` (as returned by ``bench.run`` or read
    back from its JSON) into ``out`` (PNG, or any format matplotlib knows by the suffix)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    if not datasets:
        raise ValueError("no rows to plot")
    lossy_codecs = list(dict.fromkeys(
        r["codec"] for r in rows if r["bound"] != LOSSLESS and _num(r.get("ratio"))))
    order = [c for c in _STYLE if c in lossy_codecs]
    order += [c for c in lossy_codecs if c not in order]

    n = len(datasets)
    fig, axes = plt.subplots(n, 2, figsize=(13, 3.9 * n + 0.9), squeeze=False)
    violated = False
    for i, ds in enumerate(datasets):
        ax_p, ax_b = axes[i]
        drows = [r for r in rows if r["dataset"] == ds]
        lossy = [r for r in drows if r["bound"] != LOSSLESS]
        lossless = [r for r in drows if r["bound"] == LOSSLESS]
        for codec in order:
            pts = sorted((float(r["bound"]), _num(r["ratio"]), _num(r.get("psnr")),
                          r.get("ok")) for r in lossy
                         if r["codec"] == codec and _num(r.get("ratio")))
            if not pts:
                continue
            label, color, marker, ls, lw = _style(codec)
            # tezip's default drawn last, on top of the others
            kw = dict(color=color, marker=marker, ls=ls, lw=lw, ms=5, label=label,
                      zorder=4 if codec == "tezip" else 3)
            xb = [p[0] for p in pts]
            yr = [p[1] for p in pts]
            ax_b.plot(xb, yr, **kw)
            pp = [(p[2], p[1]) for p in pts if _finite(p[2])]
            if pp:
                ax_p.plot([p[0] for p in pp], [p[1] for p in pp], **kw)
            for b, r, ps, ok in pts:
                if ok is False:
                    violated = True
                    ax_b.plot([b], [r], "kx", ms=11, mew=2)
                    if _finite(ps):
                        ax_p.plot([ps], [r], "kx", ms=11, mew=2)
        good = sorted(((_num(r["ratio"]), r["codec"]) for r in lossless
                       if r.get("ok") and _num(r.get("ratio"))), reverse=True)
        if good:
            best, who = good[0]
            for ax in (ax_p, ax_b):
                ax.axhline(best, color="0.45", ls=":", lw=1.2)
            ax_b.annotate(f"best lossless: {_short(who)} {best:.2f}", xy=(0.99, best),
                          xycoords=("axes fraction", "data"), ha="right", va="bottom",
                          fontsize=8, color="0.3")
            text = "lossless ratio\n" + "\n".join(f"{_short(c)}: {v:.2f}" for v, c in good)
            skipped = [r["codec"] for r in lossless if r.get("ratio") is None]
            if skipped:
                text += "\nskipped: " + ", ".join(_short(c) for c in skipped)
            ax_p.text(0.985, 0.97, text, transform=ax_p.transAxes, ha="right", va="top",
                      fontsize=7.5, family="monospace", multialignment="left",
                      bbox=dict(boxstyle="round", fc="0.96", ec="0.7"))
        shape = "x".join(str(s) for s in drows[0].get("shape", []))
        name = f"{ds}  ({drows[0].get('dtype', '')} {shape})"
        ax_p.set_title(f"{name}: ratio vs PSNR", fontsize=10)
        ax_b.set_title(f"{name}: ratio vs bound", fontsize=10)
        ax_p.set_xlabel("PSNR (dB; peak = value range)")
        ax_b.set_xlabel("max error bound / value range")
        ax_b.set_xscale("log")
        for ax in (ax_p, ax_b):
            ax.set_yscale("log")
            ax.set_ylabel("compression ratio")
            ax.grid(True, which="major", alpha=0.35)
            ax.grid(True, which="minor", alpha=0.12)
            _ratio_ticks(ax)

    handles = [Line2D([], [], color=_style(c)[1], marker=_style(c)[2], ls=_style(c)[3],
                      lw=_style(c)[4], label=_style(c)[0]) for c in order]
    handles.append(Line2D([], [], color="0.45", ls=":", lw=1.2, label="best lossless codec"))
    if violated:
        handles.append(Line2D([], [], color="k", marker="x", ls="", ms=9, mew=2,
                              label="bound violated"))
    fig.legend(handles=handles, loc="upper center", ncol=min(len(handles), 5), fontsize=9,
               frameon=False, bbox_to_anchor=(0.5, 1.0))
    if title:
        fig.suptitle(title, y=1.0 - 0.55 / fig.get_figheight(), fontsize=9, color="0.3")
    top = 1.0 - (1.0 if title else 0.75) / fig.get_figheight()
    fig.tight_layout(rect=(0, 0, 1, top))
    out = Path(out)
    try:
        with atomic_output(out, force=True) as tmp:       # never a half-written plot under its name
            fig.savefig(tmp, dpi=110, format=out.suffix.lstrip(".") or "png")
    finally:
        plt.close(fig)
    return out


def _short(codec: str) -> str:
    return {"tezip": "tezip auto", "tezip-classical": "tezip classical",
            "tezip-adapt": "tezip --adapt", "tezip-learned": "tezip learned",
            "blosc2-zstd5-shuffle": "blosc2 shuffle",
            "blosc2-zstd5-bitshuffle": "blosc2 bitshuf"}.get(codec, codec)


def _ratio_ticks(ax: Any) -> None:
    """Plain numbers (2, 5, 10, 20, ...) on a log ratio axis instead of 10^x."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
