"""Integer layers, one module per kind: each layer class (fields + numpy reference `run`) beside
the lowering that emits it. LAYER_TYPES (quant/qgraph.py) and LOWERINGS (quant/lowering.py) import
the modules MODULES names on their first lookup."""

MODULES = (  # full names, not built ones: the stages' code digests (pipeline/code_digest.py) follow these strings
    "dabuild.quant.layers.blocked", "dabuild.quant.layers.elementwise", "dabuild.quant.layers.embedding",
    "dabuild.quant.layers.fallback", "dabuild.quant.layers.fake_quant", "dabuild.quant.layers.linear",
    "dabuild.quant.layers.matmul", "dabuild.quant.layers.pool", "dabuild.quant.layers.resize",
    "dabuild.quant.layers.select", "dabuild.quant.layers.shape", "dabuild.quant.layers.softmax",
)
