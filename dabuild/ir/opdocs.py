"""The op reference of docs/ops.md, generated from the op registry so the documented op set is the implemented one.

dabuild.coverage puts it under the coverage table; regenerate the page after adding or changing an op:
`python -m dabuild.coverage > docs/ops.md` (tests/house/test_coverage.py fails while the file is stale).
"""

from __future__ import annotations

import json
from typing import Any

from dabuild.ir.ops import OPS, REQUIRED, Activation, Op

HEADER = """## Op reference

Layout is channels first (NCHW), as in ONNX and PyTorch; kernels compute in float32.
`None` dimensions are dynamic (the batch). `?` marks an optional input, which may be left off the
end of a node's input list. `pads` list every begin, then every end (ONNX order); null strides,
pads and dilations mean 1, 0 and 1 on every spatial axis (pooling strides default to the kernel).
Activations marked *fusable* may also be named in the `activation` attribute of `conv` and
`dense` (with their own attributes in `activation_attrs`); the passes fuse them there.

| op | inputs | attributes (defaults) | output shape | notes |
| --- | --- | --- | --- | --- |
"""


def _attribute(name: str, default: Any) -> str:
    return f"{name} (required)" if default is REQUIRED else f"{name}={json.dumps(default)}"


def _notes(op: Op) -> str:
    """The first line of the op class's own docstring, marked when conv/dense can fuse the op."""
    lines = (vars(type(op)).get("__doc__") or "").strip().splitlines()
    summary = lines[0] if lines else ""
    if isinstance(op, Activation):
        return f"fusable; {summary}" if summary else "fusable"
    return summary


def markdown() -> str:
    rows = []
    for name in sorted(OPS):
        op = OPS[name]
        attributes = ", ".join(_attribute(key, value) for key, value in op.defaults.items()) or "—"
        cells = [f"`{name}`", op.signature, attributes, op.rule, _notes(op)]
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return HEADER + "\n".join(rows) + "\n"
