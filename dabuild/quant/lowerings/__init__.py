"""The integer lowerings, one module per layer kind: each turns float nodes into the layers of
`dabuild.qir.layers.<kind>` with the calibrated ranges and the node's config. LOWERINGS
(quant/lowering.py) imports the modules MODULES names on its first lookup."""

MODULES = (  # full names, not built ones: the stages' code digests (pipeline/code_digest.py) follow these strings
    "dabuild.quant.lowerings.blocked", "dabuild.quant.lowerings.elementwise", "dabuild.quant.lowerings.embedding",
    "dabuild.quant.lowerings.fallback", "dabuild.quant.lowerings.fake_quant", "dabuild.quant.lowerings.linear",
    "dabuild.quant.lowerings.matmul", "dabuild.quant.lowerings.pool", "dabuild.quant.lowerings.resize",
    "dabuild.quant.lowerings.select", "dabuild.quant.lowerings.shape", "dabuild.quant.lowerings.softmax",
)
