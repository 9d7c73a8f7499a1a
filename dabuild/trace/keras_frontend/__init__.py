"""The Keras 3 frontend (`pip install dabuild[keras]`): `.keras` files and Keras models to dabuild Graphs.

Keras runs on its torch backend (KERAS_BACKEND defaults to "torch" here), so
TensorFlow is never needed. keras is imported only when a model is loaded or
traced, so listing frontends stays cheap. The work is split by job: `loading`
imports keras and reads model files, `walk` visits the model's layers in order
and keeps track of layouts, `layers` holds one converter per Keras layer class.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, ClassVar

from dabuild.ir.graph import Graph
from dabuild.registry import Registry
from dabuild.trace.base import Shape, TracerPlugin


class KerasTracer(TracerPlugin):
    """Traces a Keras 3 model: a `keras.Model`, a `.keras` file, or a factory taking no arguments.

    A factory may also be given an `.h5` weights file (`model.weights` in the
    recipe, as written by `model.save_weights`), loaded into the model it builds.
    """

    suffixes: ClassVar[tuple[str, ...]] = (".keras", ".h5")  # .h5: a Keras 2 model file, where Keras 3 reads it
    weights_suffixes: ClassVar[tuple[str, ...]] = (".h5",)

    @classmethod
    def converters(cls) -> Registry[Any]:
        from dabuild.trace.keras_frontend.walk import CONVERTERS

        return CONVERTERS

    @classmethod
    def build_with_weights(cls, factory: Any, path: Path, where: str) -> Any:
        from dabuild.trace.keras_frontend.loading import build_with_weights

        return build_with_weights(factory, path, where)

    @functools.cached_property
    def keras_model(self) -> Any:
        """The keras.Model traced (a factory is called once)."""
        from dabuild.trace.keras_frontend.loading import as_model

        return as_model(self.model)

    def get_input_shapes(self) -> dict[str, Shape]:
        """The model's own input shapes; model.inputs fills sizes the model leaves open and must agree."""
        from dabuild.trace.keras_frontend.walk import input_shapes

        return input_shapes(self.keras_model, self.inputs)

    def apply_model(self, inputs: dict[str, Shape]) -> Any:
        """Convert every layer over inputs of these shapes; UsageError listing every layer that cannot be."""
        from dabuild.trace.keras_frontend.walk import convert

        return convert(self.keras_model, inputs, self.progress)

    def trace(self) -> Graph:
        return self.apply_model(self.get_input_shapes())
