"""Quantization: calibration statistics, per-node configs and the integer lowering into dabuild.qir."""
