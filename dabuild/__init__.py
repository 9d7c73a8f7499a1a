"""dabuild: declarative builds of quantized neural networks."""

__version__ = "0.1.0"
