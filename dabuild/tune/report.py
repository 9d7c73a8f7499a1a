"""The tuning report: what was chosen and why, as Markdown and HTML, and report.json for the build's page.

Both documents render one list of sections (a title, lines of text, a table),
so they always say the same thing. The pictures (every trial's metric against
its cost, each node's sensitivity as a bar) are drawn once, for every backend
together, by the build-level page `dabuild report` writes from report.json
(dabuild/build_report.py, inline SVG): a stage draws nothing, so a tune stage
spends no time rendering plots and needs no plotting package.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dabuild.tune.objective import ESTIMATE
from dabuild.tune.search import Search
from dabuild.tune.trials import Trial, describe_config

REPORT_DIR = "report"
MARKDOWN, HTML, DATA = "report.md", "report.html", "report.json"


@dataclass
class Section:
    title: str
    lines: list[str] = field(default_factory=list)
    header: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)


def _percent(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f} %" if whole else "-"


def sections(title: str, search: Search, chosen: Trial, threshold: float) -> list[Section]:
    metric, space = search.metric.name, search.space
    fp32 = space.fp32()
    fp32_size, fp32_bops = space.size(fp32), space.bops(fp32)
    goal = search.goal
    comparison = "≥" if search.metric.higher_is_better else "≤"
    summary = Section(title, [
        f"Goal: {goal.criterion} loss of at most {goal.tolerable_loss:g} ({metric} {comparison} {threshold:.4f}): "
        + ("**met**." if chosen.passed else "**missed**; the best-found config is kept below."),
        f"Strategy `{search.strategy_name}`, objective `{search.objective}`: {len(search.trials)} trials"
        + (f" and {search.subset_evaluations} scores on a {len(search.subset_rows)}-row subset"
           if search.subset_evaluations else "") + f"; stopped because {search.stop_reason}.",
        *([] if chosen.passed else [f"Most harmful nodes: {', '.join(search.harmful_nodes())}."]),
    ], ["", "fp32", "chosen"], [
        [metric, f"{search.baseline:.4f}", f"{chosen.metric:.4f}"],
        ["weight bits", f"{fp32_size}", f"{chosen.size} ({_percent(chosen.size, fp32_size)})"],
        ["BOPs per sample", f"{fp32_bops}", f"{chosen.bops} ({_percent(chosen.bops, fp32_bops)})"],
        *([[f"estimate ({search.costing.unit})", "-", str(chosen.cost)]] if search.objective == ESTIMATE else []),
    ])
    errors = search.node_errors()
    described = describe_config(chosen.config)
    nodes = Section("Per-node precision", [], ["node", "op", "precision", "weight bits", "sensitivity (output MSE)"], [
        [name, node.op, described[name], str(node.weight_bits(chosen.config.nodes[name])),
         f"{errors[name]:.3g}" if name in errors else "-"]
        for name, node in space.nodes.items()
    ])
    trials = Section("Trials", [], ["#", "step", metric, "output MSE", f"{search.objective} ({search.costing.unit})", "goal"], [
        [str(t.index), t.step, f"{t.metric:.4f}", f"{t.mse:.3g}", str(t.cost), "pass" if t.passed else "fail"]
        for t in search.trials
    ])
    return [summary, nodes, trials]


def to_markdown(parts: list[Section]) -> str:
    out = []
    for index, part in enumerate(parts):
        out.append(("# " if index == 0 else "## ") + part.title + "\n")
        out += [line + "\n" for line in part.lines]
        if part.header:
            out.append("| " + " | ".join(part.header) + " |")
            out.append("|" + "---|" * len(part.header))
            out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in part.rows]
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def _inline(text: str) -> str:
    """The little Markdown the lines use: **bold**, `code`, ![alt](image)."""
    text = html.escape(text)
    if text.startswith("![") and text.endswith(")"):
        alt, _, source = text[2:-1].partition("](")
        return f'<img alt="{alt}" src="{source}">'
    for mark, tag in (("**", "strong"), ("`", "code")):
        pieces = text.split(mark)
        text = "".join(piece if i % 2 == 0 else f"<{tag}>{piece}</{tag}>" for i, piece in enumerate(pieces))
    return text


def to_html(parts: list[Section]) -> str:
    body = []
    for index, part in enumerate(parts):
        level = 1 if index == 0 else 2
        body.append(f"<h{level}>{html.escape(part.title)}</h{level}>")
        body += [f"<p>{_inline(line)}</p>" for line in part.lines]
        if part.header:
            body.append("<table>\n<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in part.header) + "</tr>")
            body += ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in part.rows]
            body.append("</table>")
    style = ("body{font-family:sans-serif;max-width:60em;margin:2em auto}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:.2em .6em;text-align:left}")
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(parts[0].title)}</title>"
            f"<style>{style}</style></head>\n<body>\n" + "\n".join(body) + "\n</body></html>\n")


def report_data(search: Search, chosen: Trial, threshold: float) -> dict[str, Any]:
    """The run as data for the build-level page (`dabuild report`): every trial's score, size and what it changed
    from the first (default) config, and each node's chosen precision and sensitivity. Nothing timed or
    machine-dependent (no seconds, no trial-store hits), so equal runs write equal bytes."""
    first = describe_config(search.trials[0].config) if search.trials else {}
    errors = search.node_errors()
    described = describe_config(chosen.config)
    return {
        "metric": search.metric.name,
        "higher_is_better": search.metric.higher_is_better,
        "fp32": search.baseline,
        "threshold": threshold,
        "objective": search.objective,
        "unit": search.costing.unit,
        "chosen": chosen.index,
        "trials": [{"trial": t.index, "step": t.step, "metric": t.metric, "size_bits": t.size, "bops": t.bops,
                    "cost": t.cost, "passed": t.passed,
                    "changed": {name: text for name, text in describe_config(t.config).items() if first.get(name) != text}}
                   for t in search.trials],
        "nodes": [{"name": name, "op": node.op, "precision": described[name],
                   "weight_bits": node.weight_bits(chosen.config.nodes[name]), "sensitivity": errors.get(name)}
                  for name, node in search.space.nodes.items()],
    }


def write_report(folder: Path, title: str, search: Search, chosen: Trial, threshold: float) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    parts = sections(title, search, chosen, threshold)
    (folder / MARKDOWN).write_text(to_markdown(parts))
    (folder / HTML).write_text(to_html(parts))
    (folder / DATA).write_text(json.dumps(report_data(search, chosen, threshold), indent=1, sort_keys=True) + "\n")
