"""Render a QGraph into C99 sources with the Jinja2 templates of this package."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import numpy as np

import dabuild
from dabuild.quant.qgraph import QGraph
from dabuild.targets.c.arena import ArenaPlan, plan_arena
from dabuild.targets.c.kernels import layer_context

PROGRAM = "model_test"
_TEMPLATES = Path(__file__).parent / "templates"


def c_array(values: np.ndarray, per_line: int = 16) -> str:
    """Array initialiser body: comma-separated integers, `per_line` to a line."""
    flat = [str(int(v)) for v in np.asarray(values).ravel()]
    lines = [", ".join(flat[i:i + per_line]) for i in range(0, len(flat), per_line)]
    return ",\n".join("    " + line for line in lines)


def c_float(value: float) -> str:
    """An exact float32 literal (hex float, C99) of `value` rounded to float32, as numpy rounds it."""
    return float(np.float32(value)).hex() + "f"


def c_identifier(name: str, taken: set[str]) -> str:
    """A unique C identifier for a layer name ('dense/1' -> 'l_dense_1')."""
    base = "l_" + re.sub(r"[^0-9A-Za-z_]", "_", name).lower()
    ident, n = base, 1
    while ident in taken:
        n += 1
        ident = f"{base}_{n}"
    taken.add(ident)
    return ident


@dataclass(frozen=True)
class Rendered:
    files: dict[str, str]       # file name -> text
    library_sources: list[str]  # .c files of the model library (main.c excluded)
    arena: ArenaPlan


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(_TEMPLATES), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                             autoescape=False)
    env.filters["c_array"] = c_array
    return env


def render(qgraph: QGraph) -> Rendered:
    env = _environment()
    version = dabuild.__version__
    edges = {qgraph.input, qgraph.output}
    arena = plan_arena([(layer.inputs, layer.outputs) for layer in qgraph.layers],
                       {name: t.size for name, t in qgraph.tensors.items()}, external=edges)

    def buffer(tensor: str) -> str:
        if tensor == qgraph.input:
            return "in"
        if tensor == qgraph.output:
            return "out"
        return f"arena + {arena.placements[tensor].offset}"

    files: dict[str, str] = {}
    ops: list[str] = []
    layers: list[dict[str, str]] = []
    taken: set[str] = set()
    for layer in qgraph.layers:
        ident = c_identifier(layer.name, taken)
        header = f"layer_{ident[2:]}.h"
        context = {"version": version, "layer": layer, "ident": ident, **layer_context(layer, qgraph)}
        files[header] = env.get_template(f"{layer.op}_layer.h.j2").render(context)
        if layer.op not in ops:
            ops.append(layer.op)
        layers.append({"ident": ident, "header": header, "function": f"{layer.op}_s8",
                       "source": buffer(layer.inputs[0]), "destination": buffer(layer.outputs[0])})
    for op in ops:
        files[f"{op}.h"] = env.get_template(f"{op}.h.j2").render(version=version)
        files[f"{op}.c"] = env.get_template(f"{op}.c.j2").render(version=version)

    source, target = qgraph.input_params, qgraph.output_params
    span = source.qmax - source.qmin
    model: dict[str, Any] = {
        "version": version,
        "input_size": qgraph.tensors[qgraph.input].size,
        "output_size": qgraph.tensors[qgraph.output].size,
        "arena_bytes": arena.peak_bytes,
        "placements": list(arena.placements.values()),
        "input_scale": c_float(source.scale), "input_scale_decimal": f"{source.scale:.9g}",
        "input_zero_point": source.zero_point,
        "input_low_bound": -span - 1, "input_high_bound": span,
        "output_scale": c_float(target.scale), "output_scale_decimal": f"{target.scale:.9g}",
        "output_zero_point": target.zero_point,
        "kernel_headers": [f"{op}.h" for op in ops],
        "layers": layers,
    }
    files["model.h"] = env.get_template("model.h.j2").render(model)
    files["model.c"] = env.get_template("model.c.j2").render(model)
    files["main.c"] = env.get_template("main.c.j2").render(version=version)
    library_sources = ["model.c", *(f"{op}.c" for op in ops)]
    build = {"version": version, "library_sources": library_sources, "program": PROGRAM,
             "headers": sorted(name for name in files if name.endswith(".h"))}
    files["Makefile"] = env.get_template("Makefile.j2").render(build)
    files["CMakeLists.txt"] = env.get_template("CMakeLists.txt.j2").render(build)
    return Rendered(files, library_sources, arena)
