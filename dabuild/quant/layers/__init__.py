"""Integer layers, one module per kind: each layer class (fields + numpy reference `run`) beside
the lowering that emits it. Importing this package registers them all."""

from dabuild.quant.layers import (  # noqa: F401  (they register)
    blocked,
    elementwise,
    embedding,
    fallback,
    given,
    linear,
    matmul,
    pool,
    resize,
    select,
    shape,
    softmax,
)
