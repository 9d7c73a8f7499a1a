"""Native kernels for the reference interpreter: small C sources compiled once on this machine (see native.py)."""
