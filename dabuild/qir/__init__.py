"""The integer IR: QGraph, its layer classes, fixed-point arithmetic and integer types.

What integer targets read and what the integer reference runs: data and integer semantics only. It sits
below lowering, calibration and tuning (dabuild.quant, dabuild.tune) and imports none of them, so a target
depends on the IR it writes out and never on how the numbers in it were chosen."""
