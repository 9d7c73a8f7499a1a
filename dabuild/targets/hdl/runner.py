"""`python -m dabuild.targets.hdl.runner ARTIFACT INPUTS OUTPUTS`: run an hdl artifact's DAIS program.

INPUTS and OUTPUTS are raw integer files (the artifact's storage dtypes, C order), as
debug bundles store them; run.sh uses this to reproduce a failed check.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from dabuild.targets.hdl.program import Manifest, run_dais


def main(argv: list[str]) -> int:
    artifact, inputs_file, outputs_file = (Path(arg) for arg in argv)
    manifest = Manifest.load(artifact)
    inputs = np.fromfile(inputs_file, dtype=manifest.input_dtype).reshape(-1, *manifest.input_shape)
    run_dais(artifact, inputs).tofile(outputs_file)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
