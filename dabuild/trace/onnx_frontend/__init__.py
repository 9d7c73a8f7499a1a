"""The ONNX frontend (`pip install dabuild[onnx]`): .onnx files to dabuild graphs.

model_file.py reads and decodes the protobuf, folding.py evaluates load-time
subgraphs, converters.py holds one converter per ONNX op, tracer.py drives them.
"""

from dabuild.trace.onnx_frontend.converters import SUPPORTED_OPS
from dabuild.trace.onnx_frontend.tracer import OnnxTracer

__all__ = ["SUPPORTED_OPS", "OnnxTracer"]
