"""`dabuild report` writes one build-level page, checked as a real headless Chromium renders it.

The test builds the digits recipe for two backends (c, onnxruntime) and a Cortex-M4 target where qemu is
installed, writes the page, and has Chromium lay it out: a script added to a copy of the page (the page itself
has none) records what the browser drew (sections, table rows, every trial's point and its place in the plot,
the labels of the sensitivity bars), and a screenshot taken at the same size shows the chosen trial's point in its
backend's colour where the layout says it is.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from dabuild.build_report import COLORS
from dabuild.cli import main

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
QEMU = shutil.which("arm-none-eabi-gcc") is not None and shutil.which("qemu-system-arm") is not None
WINDOW = (1200, 3400)

MEASURE = """<script>
const box = (element) => { const r = element.getBoundingClientRect();
  return {left: r.left, right: r.right, top: r.top, bottom: r.bottom, width: r.width, height: r.height}; };
const layout = {
  headings: [...document.querySelectorAll("h2")].map((h) => ({text: h.textContent, box: box(h)})),
  targets: [...document.querySelectorAll("#targets tr")].slice(1).map((row) => [...row.cells].map((c) => c.textContent)),
  mcu: [...document.querySelectorAll("#microcontroller-figures tr")].slice(1).map((row) => [...row.cells].map((c) => c.textContent)),
  plot: box(document.querySelector("svg.tradeoff rect")),
  plot_texts: [...document.querySelectorAll("svg.tradeoff text")].map((t) => ({text: t.textContent, box: box(t)})),
  trials: [...document.querySelectorAll("svg.tradeoff circle.trial")].map((c) => ({backend: c.dataset.backend, box: box(c)})),
  pareto: document.querySelectorAll("svg.tradeoff circle.pareto").length,
  chosen: [...document.querySelectorAll("svg.tradeoff circle.chosen")].map(box),
  labels: [...document.querySelectorAll("svg.sensitivity")].map((svg) =>
    [...svg.querySelectorAll("text.label")].map((t) => ({text: t.textContent, box: box(t)}))),
  bars: [...document.querySelectorAll("svg.sensitivity rect.bar")].map(box),
};
const out = document.createElement("pre"); out.id = "layout"; out.textContent = JSON.stringify(layout);
document.body.appendChild(out);
</script>"""


def chromium(*args: str, profile: Path) -> str:
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--user-data-dir={profile}",
               f"--window-size={WINDOW[0]},{WINDOW[1]}", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def overlap(a: dict, b: dict) -> bool:
    return a["left"] < b["right"] and b["left"] < a["right"] and a["top"] < b["bottom"] and b["top"] < a["bottom"]


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (Debian package chromium)")
def test_the_report_page_renders_every_section_in_chromium(digits: Path, tmp_path: Path, cache_dir: Path) -> None:
    pytest.importorskip("onnxruntime", reason="the page shows an onnx target's check too: needs dabuild[onnx]")
    recipe = digits / "recipe.yaml"
    text = recipe.read_text().replace("  accuracy: {criterion: relative, tolerable_loss: 0.01}",
                                      "  accuracy: {criterion: relative, tolerable_loss: 0.001}\n"
                                      "  max_trials: 8\n  allow_miss: true")  # several trials, passing or not
    text += "  - {name: ort, kind: onnx}\n"
    if QEMU:
        text += "  - {name: m4, kind: c, options: {cpu: cortex-m4}, check_io: {tolerance: exact, samples: 8}}\n"
    recipe.write_text(text)
    build_root = tmp_path / "build"
    assert main(["build", str(digits), "--build-dir", str(build_root), "-q"]) == 0
    assert main(["report", str(digits), "--build-dir", str(build_root), "-q"]) == 0
    folder = build_root / "digits-mlp"
    summary = json.loads((folder / "build.json").read_text())
    data = {stage: json.loads((folder / stage.replace(":", "-") / "report" / "report.json").read_text())
            for stage in summary["metrics"]}
    page = (folder / "report.html").read_text()
    assert "<script" not in page
    measured = tmp_path / "measured.html"
    measured.write_text(page.replace("</body>", MEASURE + "</body>"))
    dom = chromium("--dump-dom", measured.as_uri(), profile=tmp_path / "profile")
    layout = json.loads(re.search(r'<pre id="layout">(.*?)</pre>', dom, re.DOTALL)[1].replace("&amp;", "&")
                        .replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"'))

    titles = [h["text"] for h in layout["headings"]]
    assert titles == ["Targets", "Microcontroller figures", "Accuracy against size", "Per-layer choices: tune:c",
                      "Per-layer choices: tune:onnxruntime", "Stages"]
    assert all(h["box"]["height"] > 0 for h in layout["headings"])
    tops = [h["box"]["top"] for h in layout["headings"]]
    assert tops == sorted(tops)
    assert {row[0]: row[2] for row in layout["targets"]} == {
        target: "passed" if check["ok"] else "FAILED" for target, check in summary["checks"].items()}
    if QEMU:
        [m4] = layout["mcu"]
        assert m4[0] == "m4" and m4[2] == f"{summary['checks']['m4']['firmware']['flash_bytes']:,}"

    plot = layout["plot"]
    assert len(layout["trials"]) == sum(len(d["trials"]) for d in data.values())
    assert {point["backend"] for point in layout["trials"]} == {"c", "onnxruntime"}
    for point in layout["trials"]:
        centre_x = (point["box"]["left"] + point["box"]["right"]) / 2
        centre_y = (point["box"]["top"] + point["box"]["bottom"]) / 2
        assert point["box"]["width"] > 0 and plot["left"] <= centre_x <= plot["right"]
        assert plot["top"] <= centre_y <= plot["bottom"]
    assert layout["pareto"] >= len(data) and len(layout["chosen"]) == len(data)
    texts = layout["plot_texts"]  # axis names, ticks, goal, legend: none drawn over another
    for index, first in enumerate(texts):
        for second in texts[index + 1:]:
            assert not overlap(first["box"], second["box"]), (first, second)

    for labels in layout["labels"]:
        assert [label["text"] for label in labels] == [node["name"] for node in data["tune:c"]["nodes"]]
        for first, second in zip(labels, labels[1:]):
            assert not overlap(first["box"], second["box"]), (first, second)
    bars_left = min(bar["left"] for bar in layout["bars"])
    assert all(label["box"]["right"] <= bars_left for labels in layout["labels"] for label in labels)

    # What the browser painted: the last backend's chosen trial in that backend's colour, where the layout put it.
    image = pytest.importorskip("PIL.Image")
    shot = tmp_path / "page.png"
    chromium(f"--screenshot={shot}", (folder / "report.html").as_uri(), profile=tmp_path / "profile")
    with image.open(shot) as picture:
        pixels = np.asarray(picture.convert("RGB"), dtype=np.float64) / 255
    chosen = layout["chosen"][-1]
    x, y = round((chosen["left"] + chosen["right"]) / 2), round((chosen["top"] + chosen["bottom"]) / 2)
    last = data[list(data)[-1]]
    chosen_trial = next(t for t in last["trials"] if t["trial"] == last["chosen"])
    colour = COLORS[len(data) - 1]
    want = [int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    ring = pixels[y, x + 10, :3]  # the chosen ring (radius 10) is drawn in the backend's colour
    assert all(abs(g - w) < 0.1 for g, w in zip(ring, want)), (ring, want)
    centre = pixels[y, x, :3]  # a passing trial's point is filled with its backend's colour, a failing one white
    expected = want if chosen_trial["passed"] else [1.0, 1.0, 1.0]
    assert all(abs(g - w) < 0.1 for g, w in zip(centre, expected)), (centre, expected)
