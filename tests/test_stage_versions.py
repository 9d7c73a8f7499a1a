"""Stage versions follow the code: a stage whose code changed without a version bump fails here."""

from __future__ import annotations

import textwrap

from dabuild.pipeline import versions


def test_every_stage_version_is_recorded_with_the_code_it_was_bumped_for() -> None:
    problems = versions.stale()
    assert not problems, "\n".join(problems)


def test_the_digest_follows_code_but_not_docstrings_or_comments() -> None:
    code = versions._code(textwrap.dedent('''
        def f(x):
            """Doubles."""
            return 2 * x  # twice
    '''))
    assert versions._code("def f(x):\n    return 2 * x\n") == code
    assert versions._code("def f(x):\n    return 3 * x\n") != code


def test_each_stage_closes_over_what_it_runs_and_not_the_wiring() -> None:
    assert "dabuild.ir.interpreter" in versions.closure("calibrate")
    assert "dabuild.targets.c.codegen" in versions.closure("export")
    assert "dabuild.tune.search" not in versions.closure("export")
    assert not any(m.startswith("dabuild.pipeline") for kind in versions.STAGE_ROOTS for m in versions.closure(kind))
    assert any(p.name == "model.c.j2" for p in versions._data_files(versions.closure("export")))
