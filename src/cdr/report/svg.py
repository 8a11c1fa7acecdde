"""Small inline SVG charts (line and grouped bar), so a report needs no plotting library and
no network at view time. Every label goes through `html.escape`; sizes are fixed attributes
(width/height/viewBox) so a browser test can check what was drawn."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

WIDTH, HEIGHT = 400, 220
_M_LEFT, _M_RIGHT, _M_TOP, _M_BOTTOM = 40, 12, 40, 34


@dataclass
class Series:
    name: str
    values: Sequence[float | None]  # one per window (index 0 = window 1)
    color: str
    dashed: bool = False


def _fmt(y: float) -> str:
    return f"{y:.2f}".rstrip("0").rstrip(".") if y != int(y) else str(int(y))


def _frame(title: str, n: int, y_max: float, width: int, height: int) -> list[str]:
    pw, ph = width - _M_LEFT - _M_RIGHT, height - _M_TOP - _M_BOTTOM
    out = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
        f'<text x="8" y="14" class="ct">{escape(title)}</text>',
    ]
    for k in range(5):
        yv = y_max * k / 4
        y = _M_TOP + ph - ph * k / 4
        out.append(f'<line x1="{_M_LEFT}" x2="{_M_LEFT + pw}" y1="{y:.1f}" y2="{y:.1f}" '
                   'stroke="#e5e7eb"/>')
        out.append(f'<text x="{_M_LEFT - 4}" y="{y + 4:.1f}" text-anchor="end" '
                   f'class="ax">{_fmt(round(yv, 2))}</text>')
    for i in range(n):
        x = _x(i, n, pw)
        out.append(f'<text x="{x:.1f}" y="{height - _M_BOTTOM + 14}" text-anchor="middle" '
                   f'class="ax">{i + 1}</text>')
    out.append(f'<text x="{_M_LEFT + pw / 2:.1f}" y="{height - 4}" text-anchor="middle" '
               'class="ax">window</text>')
    return out


def _x(i: int, n: int, pw: float) -> float:
    return _M_LEFT + (pw * (i + 0.5) / n if n else 0.0)


def _y(v: float, y_max: float, ph: float) -> float:
    return _M_TOP + ph - ph * min(max(v / y_max, 0.0), 1.0)


def _legend(series: Sequence[Series], width: int) -> list[str]:
    """Under the title, left to right."""
    out = []
    x = float(_M_LEFT)
    for s in series:
        dash = ' stroke-dasharray="4 3"' if s.dashed else ""
        out.append(f'<line x1="{x:.1f}" x2="{x + 14:.1f}" y1="27" y2="27" stroke="{s.color}" '
                   f'stroke-width="2"{dash}/>')
        out.append(f'<text x="{x + 18:.1f}" y="31" class="lg">{escape(s.name)}</text>')
        x += 30 + 6.2 * len(s.name)
    return out


def nice_max(top: float) -> float:
    """The smallest 'round' axis maximum ≥ top whose quarters are whole numbers for counts."""
    if top <= 0:
        return 1.0
    step = 1.0
    while step * 4 < top:
        step *= 2 if str(int(step))[0] in "15" else 2.5
    return step * 4


def line_chart(title: str, series: Sequence[Series], y_max: float = 1.0,
               width: int = WIDTH, height: int = HEIGHT, legend: bool = True) -> str:
    """One line per series over windows 1..n (n = the longest series)."""
    n = max((len(s.values) for s in series), default=0)
    y_max = y_max or 1.0
    pw, ph = width - _M_LEFT - _M_RIGHT, height - _M_TOP - _M_BOTTOM
    out = _frame(title, n, y_max, width, height)
    for s in series:
        pts = [(_x(i, n, pw), _y(v, y_max, ph), i, v) for i, v in enumerate(s.values)
               if v is not None]
        dash = ' stroke-dasharray="5 4"' if s.dashed else ""
        if len(pts) > 1:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y, _, _ in pts)
            out.append(f'<polyline class="series" fill="none" stroke="{s.color}" '
                       f'stroke-width="2"{dash} points="{path}"/>')
        for x, y, i, v in pts:
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{s.color}">'
                       f"<title>{escape(s.name)}, window {i + 1}: {v:.2f}</title></circle>")
    if legend:
        out.extend(_legend(series, width))
    out.append("</svg>")
    return "".join(out)


def bar_chart(title: str, series: Sequence[Series], width: int = WIDTH,
              height: int = HEIGHT) -> str:
    """Grouped bars: per window, one bar per series."""
    n = max((len(s.values) for s in series), default=0)
    top = max((v for s in series for v in s.values if v is not None), default=0.0)
    y_max = nice_max(float(top))
    pw, ph = width - _M_LEFT - _M_RIGHT, height - _M_TOP - _M_BOTTOM
    out = _frame(title, n, y_max, width, height)
    slot = pw / n if n else pw
    bw = min(slot * 0.8 / max(len(series), 1), 28)
    for j, s in enumerate(series):
        for i, v in enumerate(s.values):
            if v is None:
                continue
            x = _x(i, n, pw) - bw * len(series) / 2 + j * bw
            y = _y(v, y_max, ph)
            h = max(_M_TOP + ph - y, 0.0)
            out.append(f'<rect class="bar" x="{x:.1f}" y="{y:.1f}" width="{bw - 1:.1f}" '
                       f'height="{h:.1f}" fill="{s.color}">'
                       f"<title>{escape(s.name)}, window {i + 1}: {_fmt(v)}</title></rect>")
    out.extend(_legend(series, width))
    out.append("</svg>")
    return "".join(out)
