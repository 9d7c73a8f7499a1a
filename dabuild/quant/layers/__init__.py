"""Integer layers, one module per kind: each layer class (fields + numpy reference `run`) beside
the lowering that emits it. LAYER_TYPES (quant/qgraph.py) and LOWERINGS (quant/lowering.py) import
the modules MODULES names on their first lookup."""

MODULES = tuple(f"dabuild.quant.layers.{kind}" for kind in (
    "blocked", "elementwise", "embedding", "fallback", "fake_quant", "linear", "matmul", "pool", "resize", "select",
    "shape", "softmax"))
