"""Integer layers, one module per kind: each layer class (fields + numpy reference `run`) beside
the lowering that emits it. LAYER_TYPES (qir/qgraph.py) and LOWERINGS (quant/lowering.py) import
the modules MODULES names on their first lookup."""

MODULES = (  # full names, not built ones: the stages' code digests (pipeline/code_digest.py) follow these strings
    "dabuild.qir.layers.blocked", "dabuild.qir.layers.elementwise", "dabuild.qir.layers.embedding",
    "dabuild.qir.layers.fallback", "dabuild.qir.layers.fake_quant", "dabuild.qir.layers.linear",
    "dabuild.qir.layers.matmul", "dabuild.qir.layers.pool", "dabuild.qir.layers.resize",
    "dabuild.qir.layers.select", "dabuild.qir.layers.shape", "dabuild.qir.layers.softmax",
)
