"""The torch frontend (`pip install dabuild[torch]`): nn.Modules and torch.export archives to dabuild Graphs.

This module imports torch only when a model is traced, so listing or choosing
frontends stays cheap. The work is split by job: `capture` turns a model into
an ATen graph (torch.export, else torch.fx), `convert` walks that graph,
`aten` holds one converter per ATen op, `weights` loads state dicts.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, ClassVar

from dabuild.ir.graph import Graph
from dabuild.registry import Registry, import_extra
from dabuild.trace.base import Shape, TracerPlugin


class TorchTracer(TracerPlugin):
    """Traces a `torch.nn.Module` in eval mode, or a `.pt2` export archive.

    The model may also be a factory taking no arguments (a class or function
    returning the module), or a plain function of tensors.
    """

    suffixes: ClassVar[tuple[str, ...]] = (".pt2",)
    weights_suffixes: ClassVar[tuple[str, ...]] = (".pt", ".pth")

    @classmethod
    def converters(cls) -> Registry[Any]:
        return import_extra("dabuild.trace.torch_frontend.aten", "torch", "the torch frontend").CONVERTERS

    @classmethod
    def build_with_weights(cls, factory: Any, path: Path, where: str) -> Any:
        from dabuild.trace.torch_frontend.weights import build_with_state_dict

        return build_with_state_dict(factory, path, where)

    @functools.cached_property
    def program(self) -> Any:
        """The torch.export archive the model path names (archives only)."""
        from dabuild.trace.torch_frontend.capture import load_archive

        return load_archive(Path(self.model))

    def get_input_shapes(self) -> dict[str, Shape]:
        """model.inputs; for an archive without them, the shapes its user inputs were exported with."""
        if self.inputs or not isinstance(self.model, (str, Path)):
            return super().get_input_shapes()
        from dabuild.trace.torch_frontend.capture import capture_program
        from dabuild.trace.torch_frontend.convert import Builder

        capture = capture_program(self.program)
        return {node.name: Builder(capture, []).dims(node.meta["val"]) for node in capture.inputs}

    @functools.cached_property
    def module(self) -> Any:
        """The nn.Module to capture (see capture.as_module: modules, factories, functions of tensors)."""
        from dabuild.trace.torch_frontend.capture import as_module

        return as_module(self.model)

    def apply_model(self, inputs: dict[str, Any]) -> Any:
        """Capture the model on example inputs of these shapes: the ATen graph (a `Capture`) it computes."""
        from dabuild.trace.torch_frontend.aten import known
        from dabuild.trace.torch_frontend.capture import capture_module, capture_program, eval_mode

        if isinstance(self.model, (str, Path)):
            return capture_program(self.program, known)
        with eval_mode(self.module):
            return capture_module(self.module, inputs, known, self.progress, self.dtypes)

    def trace(self) -> Graph:
        from dabuild.trace.torch_frontend.capture import describe
        from dabuild.trace.torch_frontend.convert import convert

        shapes = self.get_input_shapes()
        capture = self.apply_model(shapes)
        origin = str(self.model) if isinstance(self.model, (str, Path)) else describe(self.module)
        self.progress.debug(f"captured {origin} with {capture.how}")
        return convert(capture, shapes, origin)
