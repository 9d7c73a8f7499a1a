"""The `given` strategy: take the quantization the model carries, search nothing.

The tuning space already fixes every role the model quantizes (see
`dabuild.quant.given_params`); this strategy scores its default config once, so the
roles the model left in float take the capability's first choice, calibrated.
To search those instead, name another strategy: it sees one choice for every
given role and searches the rest. It is the default strategy for a model
that carries quantization.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from dabuild.tune.search import Search


class GivenStrategy:
    name: ClassVar[str] = "given"

    def search(self, search: Search) -> None:
        search.evaluate([search.space.default()], "given")
