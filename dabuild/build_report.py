"""The build-level report: one plain HTML page (inline SVG, no script, no server) that `dabuild report` writes.

It reads only what the last build left: build.json (stage outcomes and times, every check's verdict and, for a
Cortex-M target, its firmware figures) and each tune stage's report/report.json (every trial's score, size and
what it changed; each node's precision and sensitivity). Sections: the targets and their verdicts, the MCU
figures, accuracy against size for every trial of every backend with each backend's Pareto front, then per
backend the per-layer choices with a sensitivity bar per layer, and the stages with their times.
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dabuild.errors import UsageError

PAGE = "report.html"
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
FRONT_COLOR = "#000000"
WIDTH, HEIGHT, MARGIN, LEFT = 720, 380, 64, 96  # LEFT: room for the metric's ticks and name


@dataclass(frozen=True)
class Backend:
    """One tune stage's run as report.json records it."""

    stage: str  # tune:<capability>
    data: dict[str, Any]

    @property
    def capability(self) -> str:
        return self.stage.split(":", 1)[1]


def write_page(build_dir: Path) -> Path:
    """Write build_dir/report.html from the last build's files; UsageError when they are missing."""
    summary_file = build_dir / "build.json"
    try:
        summary = json.loads(summary_file.read_text())
    except (OSError, ValueError) as error:
        raise UsageError(f"{summary_file}: no readable build summary ({error}); run `dabuild build` first") from None
    backends = []
    for stage in summary.get("metrics", {}):
        data_file = build_dir / stage.replace(":", "-") / "report" / "report.json"
        try:
            backends.append(Backend(stage, json.loads(data_file.read_text())))
        except (OSError, ValueError) as error:
            raise UsageError(f"{data_file}: unreadable ({error}); rebuild to write it") from None
    page = build_dir / PAGE
    page.write_text(render(summary, backends))
    return page


def render(summary: dict[str, Any], backends: list[Backend]) -> str:
    title = f"dabuild report: {summary['recipe']}"
    sections = [
        _section("Targets", _targets(summary)),
        _section("Microcontroller figures", _mcu(summary)),
        _section("Accuracy against size", _tradeoff(backends)),
        *[_section(f"Per-layer choices: {b.stage}", _layers(b)) for b in backends],
        _section("Stages", _stages(summary)),
    ]
    style = ("body{font-family:sans-serif;max-width:62em;margin:2em auto;color:#222}table{border-collapse:collapse;"
             "margin:.5em 0}td,th{border:1px solid #ccc;padding:.2em .6em;text-align:left}td.num{text-align:right}"
             ".pass{color:#1a7f37;font-weight:bold}.fail{color:#cf222e;font-weight:bold}svg{display:block}"
             "svg text{font-size:12px;fill:#222}")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{style}</style></head>\n<body>\n<h1>{html.escape(title)}</h1>\n"
            + "\n".join(sections) + "\n</body></html>\n")


def _section(title: str, body: str) -> str:
    slug = "".join(c if c.isalnum() else "-" for c in title.lower())
    return f'<section id="{html.escape(slug)}">\n<h2>{html.escape(title)}</h2>\n{body}\n</section>'


def _table(header: list[str], rows: list[list[str]], numeric: frozenset[int] = frozenset()) -> str:
    """A table of already-escaped cells; columns in `numeric` align right."""
    head = "<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>"
    body = ["<tr>" + "".join(f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(row))
            + "</tr>" for row in rows]
    return "<table>\n" + "\n".join([head, *body]) + "\n</table>"


def _targets(summary: dict[str, Any]) -> str:
    rows = []
    for target, check in summary.get("checks", {}).items():
        verdict = '<span class="pass">passed</span>' if check.get("ok") else '<span class="fail">FAILED</span>'
        metric = check.get("metric") or {}
        delivered = (f"{metric['artifact']:.4f} (reference {metric['reference']:.4f})"
                     if "artifact" in metric and "reference" in metric else "-")
        not_run = "; ".join(check.get("not_run", [])) or "-"
        rows.append([html.escape(target), html.escape(str(check.get("target", "-"))), verdict,
                     html.escape(str(check.get("tolerance", "-"))), str(check.get("samples", "-")), delivered,
                     html.escape(not_run), html.escape(str(check.get("artifact", "-")))])
    if not rows:
        return "<p>No target was checked in this build.</p>"
    return _table(["target", "kind", "check", "tolerance", "samples", "metric in its runtime", "not run",
                   "artifact"], rows, frozenset({4}))


def _mcu(summary: dict[str, Any]) -> str:
    rows = []
    for target, check in summary.get("checks", {}).items():
        firmware = check.get("firmware")
        if not firmware:
            continue
        cells = [firmware.get(key) for key in ("flash_bytes", "ram_bytes", "stack_bytes", "instructions_per_inference",
                                                "state_bytes", "instructions_per_hop")]   # the last two: streaming
        rows.append([html.escape(target), html.escape(str(firmware.get("board", "-"))),
                     *["-" if value is None else f"{value:,}" for value in cells]])
    if not rows:
        return "<p>No microcontroller target in this build.</p>"
    return _table(["target", "board", "flash (bytes)", "RAM (bytes)", "stack (bytes)", "instructions per inference",
                   "streaming state (bytes, in RAM)", "instructions per hop"], rows, frozenset({2, 3, 4, 5, 6, 7}))


def _stages(summary: dict[str, Any]) -> str:
    seconds = summary.get("seconds", {})
    rows = [[html.escape(stage), html.escape(outcome), f"{seconds[stage]:.2f}" if stage in seconds else "-"]
            for stage, outcome in summary.get("outcomes", {}).items()]
    return _table(["stage", "outcome", "seconds"], rows, frozenset({2}))


def pareto_front(points: list[tuple[float, float]], higher_is_better: bool) -> list[int]:
    """Indices of the points no other point beats on both size (smaller) and metric, by increasing size."""
    sign = 1 if higher_is_better else -1
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -sign * points[i][1]))
    front, best = [], -math.inf
    for index in order:
        score = sign * points[index][1]
        if score > best:
            front.append(index)
            best = score
    return front


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    if high <= low:
        return [low]
    step = (high - low) / (count - 1)
    return [low + i * step for i in range(count)]


def _tradeoff(backends: list[Backend]) -> str:
    """An SVG scatter of every trial (x: weight bytes, y: metric), one colour per backend, each backend's Pareto
    front joined by a line and its points ringed, the chosen trial as a larger ring, the goal as a dashed line."""
    trials = [(b, t) for b in backends for t in b.data["trials"]]
    if not trials:
        return "<p>No trials were recorded.</p>"
    sizes = [t["size_bits"] / 8 for _, t in trials]
    metrics = [t["metric"] for _, t in trials] + [b.data["threshold"] for b in backends]
    x_low, x_high = 0.0, max(sizes) * 1.05 or 1.0
    y_low, y_high = min(metrics), max(metrics)
    pad = (y_high - y_low) * 0.08 or 0.01
    y_low, y_high = y_low - pad, y_high + pad

    def x_of(value: float) -> float:
        return LEFT + (value - x_low) / (x_high - x_low) * (WIDTH - LEFT - MARGIN)

    def y_of(value: float) -> float:
        return HEIGHT - MARGIN - (value - y_low) / (y_high - y_low) * (HEIGHT - 2 * MARGIN)

    parts = [(f'<svg xmlns="http://www.w3.org/2000/svg" class="tradeoff" width="{WIDTH}" height="{HEIGHT}" '
             f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="accuracy against size, every trial">'),
             (f'<rect x="{LEFT}" y="{MARGIN}" width="{WIDTH - LEFT - MARGIN}" height="{HEIGHT - 2 * MARGIN}" '
             'fill="#fafafa" stroke="#888"/>')]
    for value in _ticks(x_low, x_high):
        parts.append(f'<text x="{x_of(value):.1f}" y="{HEIGHT - MARGIN + 16}" text-anchor="middle">{value:,.0f}</text>')
    decimals = max(2, 1 - math.floor(math.log10((y_high - y_low) / 4)))  # ticks that differ in their text
    for value in _ticks(y_low, y_high):
        parts.append(f'<text x="{LEFT - 6}" y="{y_of(value) + 4:.1f}" text-anchor="end">{value:.{decimals}f}</text>')
    metric = html.escape(backends[0].data["metric"])
    parts.append(f'<text x="{(LEFT + WIDTH - MARGIN) / 2}" y="{HEIGHT - 18}" text-anchor="middle">weight size (bytes)</text>')
    parts.append(f'<text x="16" y="{HEIGHT / 2}" text-anchor="middle" transform="rotate(-90 16 {HEIGHT / 2})">'
                 f"{metric}</text>")
    for threshold in sorted({b.data["threshold"] for b in backends}):
        y = y_of(threshold)
        parts.append(f'<line class="goal" x1="{LEFT}" x2="{WIDTH - MARGIN}" y1="{y:.1f}" y2="{y:.1f}" '
                     f'stroke="#cf222e" stroke-dasharray="6 4"/>')
        parts.append(f'<text x="{WIDTH - MARGIN - 4}" y="{y - 4:.1f}" text-anchor="end" fill="#cf222e">goal</text>')
    for index, backend in enumerate(backends):
        color = COLORS[index % len(COLORS)]
        data = backend.data
        points = [(t["size_bits"] / 8, t["metric"]) for t in data["trials"]]
        front = pareto_front(points, data["higher_is_better"])
        line = " ".join(f"{x_of(points[i][0]):.1f},{y_of(points[i][1]):.1f}" for i in front)
        parts.append(f'<polyline class="front" points="{line}" fill="none" stroke="{color}" stroke-width="1.5"/>')
        for position, trial in enumerate(data["trials"]):
            x, y = x_of(points[position][0]), y_of(points[position][1])
            changed = "; ".join(f"{name}: {readable(text)}" for name, text in trial["changed"].items()) or "the default"
            tip = (f"{backend.stage} trial {trial['trial']} ({trial['step']}): {data['metric']} {trial['metric']:.4f}, "
                   f"{points[position][0]:,.0f} bytes, {'pass' if trial['passed'] else 'fail'}; changed: {changed}")
            fill = color if trial["passed"] else "white"
            parts.append(f'<circle class="trial" data-backend="{html.escape(backend.capability)}" cx="{x:.1f}" '
                         f'cy="{y:.1f}" r="4" fill="{fill}" stroke="{color}" stroke-width="1.5">'
                         f"<title>{html.escape(tip)}</title></circle>")
        for position in front:
            x, y = x_of(points[position][0]), y_of(points[position][1])
            parts.append(f'<circle class="pareto" cx="{x:.1f}" cy="{y:.1f}" r="7" fill="none" stroke="{FRONT_COLOR}"/>')
        chosen = next(p for p, t in enumerate(data["trials"]) if t["trial"] == data["chosen"])
        x, y = x_of(points[chosen][0]), y_of(points[chosen][1])
        parts.append(f'<circle class="chosen" cx="{x:.1f}" cy="{y:.1f}" r="10" fill="none" stroke="{color}" '
                     'stroke-width="2.5"/>')
    legend_y = MARGIN - 40
    for index, backend in enumerate(backends):
        color, x = COLORS[index % len(COLORS)], LEFT + index * 190
        parts.append(f'<circle cx="{x + 6}" cy="{legend_y}" r="5" fill="{color}"/>'
                     f'<text class="legend" x="{x + 16}" y="{legend_y + 4}">{html.escape(backend.stage)} '
                     f'({len(backend.data["trials"])} trials)</text>')
    parts.append(f'<text class="legend" x="{LEFT}" y="{legend_y + 22}">filled: meets the goal; hollow: misses it; '
                 "black rings: Pareto front; large ring: chosen</text>")
    parts.append("</svg>")
    return "\n".join(parts)


def readable(description: str) -> str:
    """`w:int8/sym/per_channel/minmax a:int8/asym/per_tensor/mse` as `weights int8 sym per-channel (minmax),
    activations int8 asym per-tensor (mse)`; `fp32` as `float32 island`."""
    if description == "fp32":
        return "float32 island"
    roles = {"w": "weights", "a": "activations"}
    words = []
    for part in description.split():
        role, _, fields = part.partition(":")
        dtype, scheme, granularity, algorithm = (fields.split("/") + ["", "", "", ""])[:4]
        words.append(f"{roles.get(role, role)} {dtype} {scheme} {granularity.replace('_', '-')} ({algorithm})")
    return ", ".join(words)


def _layers(backend: Backend) -> str:
    """Each node's chosen precision in words, its weight bits, and its sensitivity as a bar (log scale: the
    output MSE under the default config spans decades), the node's name written beside its own bar."""
    nodes = backend.data["nodes"]
    known = [n["sensitivity"] for n in nodes if n["sensitivity"] is not None and n["sensitivity"] > 0]
    low, high = (math.log10(min(known)), math.log10(max(known))) if known else (0.0, 0.0)
    row_height, label_width, bar_width = 22, 260, 360
    parts = [(f'<svg xmlns="http://www.w3.org/2000/svg" class="sensitivity" width="{label_width + bar_width + 90}" '
             f'height="{row_height * len(nodes) + 30}" role="img" aria-label="per-layer sensitivity">'),
             f'<text x="{label_width}" y="14">output MSE under the default config (log scale)</text>']
    for row, node in enumerate(nodes):
        y = 24 + row * row_height
        value = node["sensitivity"]
        share = (math.log10(value) - low) / (high - low) if value and value > 0 and high > low else (1.0 if value else 0.0)
        width = 4 + share * (bar_width - 4)
        parts.append(f'<text class="label" x="{label_width - 8}" y="{y + 14}" text-anchor="end">'
                     f'{html.escape(node["name"])}</text>')
        if value is not None:
            parts.append(f'<rect class="bar" x="{label_width}" y="{y + 3}" width="{width:.1f}" height="{row_height - 6}" '
                         f'fill="#1f77b4"><title>{html.escape(node["name"])}: {value:.3g}</title></rect>')
            parts.append(f'<text x="{label_width + width + 6:.1f}" y="{y + 14}">{value:.3g}</text>')
    parts.append("</svg>")
    data = backend.data
    chosen = next(t for t in data["trials"] if t["trial"] == data["chosen"])
    lines = (f"<p>Chosen: trial {chosen['trial']} ({html.escape(chosen['step'])}), {html.escape(data['metric'])} "
             f"{chosen['metric']:.4f} (fp32 {data['fp32']:.4f}, goal {data['threshold']:.4f}), "
             f"{chosen['size_bits'] / 8:,.0f} weight bytes, of {len(data['trials'])} trials.</p>")
    table = _table(["layer", "op", "precision", "weight bits"],
                   [[html.escape(n["name"]), html.escape(n["op"]), html.escape(readable(n["precision"])),
                     str(n["weight_bits"])] for n in nodes], frozenset({3}))
    return lines + table + "\n" + "\n".join(parts)
