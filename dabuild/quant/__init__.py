"""Quantization: calibration statistics, per-node configs, integer lowering and its numpy reference."""
