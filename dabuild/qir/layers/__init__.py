"""Integer layers, one module per kind: each layer class holds its fields and its numpy reference `run`
(the bits the targets' kernels reproduce). How float nodes become these layers is dabuild.quant.lowerings'.
LAYER_TYPES (qir/qgraph.py) imports the modules MODULES names on its first lookup."""

MODULES = (  # full names, not built ones: the stages' code digests (pipeline/code_digest.py) follow these strings
    "dabuild.qir.layers.blocked", "dabuild.qir.layers.elementwise", "dabuild.qir.layers.embedding",
    "dabuild.qir.layers.fallback", "dabuild.qir.layers.fake_quant", "dabuild.qir.layers.linear",
    "dabuild.qir.layers.matmul", "dabuild.qir.layers.pool", "dabuild.qir.layers.resize",
    "dabuild.qir.layers.select", "dabuild.qir.layers.shape", "dabuild.qir.layers.softmax",
)
