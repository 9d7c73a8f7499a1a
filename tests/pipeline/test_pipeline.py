"""The build graph end to end on the digits example: cache, no-op, revert, sharing, partial rebuilds."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dabuild.cli import main

ALL_STAGES = {"trace", "calibrate", "tune:c", "export:mcu", "check:mcu"}


def build(recipe_dir: Path, build_root: Path, *extra: str) -> dict:
    code = main(["build", str(recipe_dir), "--build-dir", str(build_root), "-q", *extra])
    assert code == 0
    name = _recipe_name(recipe_dir)
    return json.loads((build_root / name / "build.json").read_text())


def _recipe_name(recipe_dir: Path) -> str:
    for line in (recipe_dir / "recipe.yaml").read_text().splitlines():
        if line.startswith("name:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError("recipe has no name")


def executed(summary: dict) -> set[str]:
    return {stage for stage, outcome in summary["outcomes"].items() if outcome == "executed"}


def restored(summary: dict) -> set[str]:
    return {stage for stage, outcome in summary["outcomes"].items() if outcome == "restored from cache"}


def edit(recipe_dir: Path, old: str, new: str) -> None:
    path = recipe_dir / "recipe.yaml"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def test_cold_build_then_noop(digits: Path, tmp_path: Path, cache_dir: Path) -> None:
    first = build(digits, tmp_path / "build")
    assert executed(first) == ALL_STAGES
    check = first["checks"]["mcu"]
    assert check["ok"] and check["tolerance"] == "exact"
    metrics = first["metrics"]["tune:c"]
    assert metrics["fp32"] > 0.9 and metrics["quantized"] > 0.9
    assert (tmp_path / "build" / "digits-mlp" / "report" / "c" / "report.md").is_file()
    assert set(first["seconds"]) == ALL_STAGES and all(first["seconds"][stage] > 0 for stage in ALL_STAGES)
    second = build(digits, tmp_path / "build")
    assert executed(second) == set() and restored(second) == set()
    assert set(second["outcomes"].values()) == {"up to date"}


def test_reverted_change_restores_from_cache(digits: Path, tmp_path: Path, cache_dir: Path) -> None:
    build(digits, tmp_path / "build")
    edit(digits, "cflags: [-O2]", "cflags: [-O1]")
    changed = build(digits, tmp_path / "build")
    assert executed(changed) == {"export:mcu", "check:mcu"}
    edit(digits, "cflags: [-O1]", "cflags: [-O2]")
    reverted = build(digits, tmp_path / "build")
    assert executed(reverted) == set()
    assert restored(reverted) == {"export:mcu", "check:mcu"}


def test_changing_one_target_rebuilds_only_that_target(digits: Path, tmp_path: Path, cache_dir: Path) -> None:
    text = (digits / "recipe.yaml").read_text()
    text += "  - name: mcu2\n    kind: c\n    options: {cflags: [-O2]}\n"
    (digits / "recipe.yaml").write_text(text)
    first = build(digits, tmp_path / "build")
    assert executed(first) == ALL_STAGES
    assert restored(first) == {"export:mcu2", "check:mcu2"}  # same settings as mcu: same keys
    edit(digits, "  - name: mcu2\n    kind: c\n    options: {cflags: [-O2]}", "  - name: mcu2\n    kind: c\n    options: {cflags: [-O3]}")
    second = build(digits, tmp_path / "build", "-j", "2")
    assert executed(second) == {"export:mcu2", "check:mcu2"}


def test_recipes_sharing_model_and_data_share_trace_and_calibrate(
    digits: Path, tmp_path: Path, cache_dir: Path
) -> None:
    build(digits, tmp_path / "build")
    other = tmp_path / "other"
    shutil.copytree(digits, other)
    edit(other, "name: digits-mlp", "name: digits-other")
    edit(other, "tolerable_loss: 0.01", "tolerable_loss: 0.02")
    summary = build(other, tmp_path / "build")
    assert restored(summary) >= {"trace", "calibrate"}
    assert "tune:c" in executed(summary)


def test_bias_correction_asks_calibrate_for_per_channel_histograms(digits: Path, tmp_path: Path,
                                                                   cache_dir: Path) -> None:
    """Per-channel histograms serve bias correction's channel means alone: a build without it keeps the
    whole-tensor ones (the same counts), and turning it on recalibrates with both."""
    from dabuild.quant.calibrate import Stats

    build(digits, tmp_path / "build")
    stats_dir = tmp_path / "build" / "digits-mlp" / "calibrate"
    plain = Stats.load(stats_dir)
    assert not plain.per_channel and all(tensor.channels is None for tensor in plain.tensors.values())
    edit(digits, "  strategy: basic\n", "  strategy: basic\n  bias_correction: true\n")
    corrected = build(digits, tmp_path / "build")
    assert {"calibrate", "tune:c"} <= executed(corrected)
    full = Stats.load(stats_dir)
    assert full.per_channel and full.ranges == plain.ranges
    assert all(np.array_equal(full.tensors[name].whole.counts, plain.tensors[name].whole.counts)
               for name in plain.tensors)


def test_no_cache_executes_everything_and_stores_nothing(digits: Path, tmp_path: Path, cache_dir: Path) -> None:
    summary = build(digits, tmp_path / "build", "--no-cache")
    assert executed(summary) == ALL_STAGES
    assert not (cache_dir / "v1" / "entries").exists()


def test_corrupt_cache_entry_is_rebuilt(digits: Path, tmp_path: Path, cache_dir: Path) -> None:
    build(digits, tmp_path / "build")
    for stored in (cache_dir / "v1" / "entries").rglob("weights.npz"):
        stored.chmod(0o644)
        stored.write_bytes(stored.read_bytes()[:-3] + b"xyz")
    shutil.rmtree(tmp_path / "build")
    summary = build(digits, tmp_path / "build")
    assert "trace" in executed(summary)
    assert "calibrate" in restored(summary)


def test_lost_doit_database_costs_no_stage_execution(digits: Path, tmp_path: Path, cache_dir: Path) -> None:
    build(digits, tmp_path / "build")
    (tmp_path / "build" / "digits-mlp" / ".doit.db").unlink()
    summary = build(digits, tmp_path / "build")
    assert executed(summary) == set() and restored(summary) == set()


def test_damaged_doit_database_is_replaced(digits: Path, tmp_path: Path, cache_dir: Path) -> None:
    build(digits, tmp_path / "build")
    (tmp_path / "build" / "digits-mlp" / ".doit.db").write_bytes(b"not a database at all" * 100)
    summary = build(digits, tmp_path / "build")
    assert executed(summary) == set()


def test_removed_output_file_is_rebuilt(digits: Path, tmp_path: Path, cache_dir: Path) -> None:
    build(digits, tmp_path / "build")
    export_dir = tmp_path / "build" / "digits-mlp" / "export-mcu"
    (export_dir / "model.c").unlink()
    summary = build(digits, tmp_path / "build")
    assert restored(summary) == {"export:mcu"} and executed(summary) == set()
    assert (export_dir / "model.c").exists()


def test_target_selection_builds_only_that_target(digits: Path, tmp_path: Path, cache_dir: Path) -> None:
    summary = build(digits, tmp_path / "build", "--target", "mcu")
    assert executed(summary) == ALL_STAGES
    code = main(["build", str(digits), "--build-dir", str(tmp_path / "build"), "--target", "nope", "-q"])
    assert code == 2


def test_list_explains_each_stage(digits: Path, tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture) -> None:
    root = str(tmp_path / "build")
    assert main(["list", str(digits), "--build-dir", root]) == 0
    assert "trace" in capsys.readouterr().out
    build(digits, tmp_path / "build")
    edit(digits, "cflags: [-O2]", "cflags: [-O1]")
    assert main(["list", str(digits), "--build-dir", root]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert "up to date" in lines["trace"] and "up to date" in lines["tune:c"]
    assert "stale (recipe settings changed)" in lines["export:mcu"]
    assert "stale (input export:mcu will be rebuilt)" in lines["check:mcu"]
    build(digits, tmp_path / "build")
    edit(digits, "cflags: [-O1]", "cflags: [-O2]")
    assert main(["list", str(digits), "--build-dir", root]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert "cached" in lines["export:mcu"]


def test_graph_formats(digits: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["graph", str(digits)]) == 0
    dot = capsys.readouterr().out
    assert '"trace" -> "calibrate";' in dot and '"tune:c" -> "export:mcu";' in dot
    assert main(["graph", str(digits), "--format", "mermaid"]) == 0
    mermaid = capsys.readouterr().out
    assert mermaid.startswith("graph LR") and "export-mcu --> check-mcu" in mermaid


def test_clean_removes_the_build_folder(digits: Path, tmp_path: Path, cache_dir: Path) -> None:
    build(digits, tmp_path / "build")
    assert main(["clean", str(digits), "--build-dir", str(tmp_path / "build"), "-q"]) == 0
    assert not (tmp_path / "build" / "digits-mlp" / "trace").exists()
    summary = build(digits, tmp_path / "build")
    assert restored(summary) == ALL_STAGES


def test_init_writes_a_project_that_builds_as_written(tmp_path: Path, cache_dir: Path,
                                                      capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """`dabuild init DIR` says to build from DIR, so the build folder lands in DIR, not where init ran."""
    project = tmp_path / "project"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["init", str(project)]) == 0
    assert f"run `cd {project} && dabuild build` (the build goes to {project / 'build'})" in capsys.readouterr().err
    assert {p.name for p in project.iterdir()} >= {"recipe.yaml", "model.py", "make_data.py", "data.npz",
                                                   "weights.npz"}
    assert main(["init", str(project), "-q"]) == 2  # refuses to overwrite
    monkeypatch.chdir(project)
    assert main(["build", "-q"]) == 0
    assert list(elsewhere.iterdir()) == []
    summary = json.loads((project / "build" / "my-model" / "build.json").read_text())
    assert summary["checks"]["mcu"]["ok"] and summary["metrics"]["tune:c"]["goal_met"]
    assert summary["metrics"]["tune:c"]["fp32"] > 0.9


def test_capabilities_lists_the_bundled_c_backend(capsys: pytest.CaptureFixture) -> None:
    assert main(["capabilities"]) == 0
    assert capsys.readouterr().out.split()[0] == "c"


def test_missing_recipe_is_a_usage_error(tmp_path: Path) -> None:
    assert main(["build", str(tmp_path / "nowhere.yaml")]) == 2


def test_noop_build_skips_heavy_imports(digits: Path, tmp_path: Path, cache_dir: Path) -> None:
    import subprocess
    import sys

    build(digits, tmp_path / "build")
    probe = (
        "import sys; from dabuild.cli import main; "
        f"code = main(['build', {str(digits)!r}, '--build-dir', {str(tmp_path / 'build')!r}, '-q']); "
        "print(code, sorted(m for m in ('numpy', 'pydantic', 'doit') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "0 []"


def test_touched_input_takes_the_full_path_and_still_executes_nothing(
    digits: Path, tmp_path: Path, cache_dir: Path
) -> None:
    import os

    build(digits, tmp_path / "build")
    data = digits / "data.npz"
    os.utime(data, ns=(data.stat().st_atime_ns, data.stat().st_mtime_ns + 10**9))
    summary = build(digits, tmp_path / "build")
    assert executed(summary) == set() and restored(summary) == set()


def test_capability_path_change_alone_is_noticed(
    digits: Path, tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build(digits, tmp_path / "build")
    extra = tmp_path / "caps"
    extra.mkdir()
    (extra / "broken.yaml").write_text("name: broken\nbackend: x\n")
    monkeypatch.setenv("DABUILD_CAPABILITY_PATH", str(extra))
    assert main(["build", str(digits), "--build-dir", str(tmp_path / "build"), "-q"]) == 2
    (extra / "broken.yaml").unlink()
    assert main(["build", str(digits), "--build-dir", str(tmp_path / "build"), "-q"]) == 0


def test_noop_stamp_watches_the_metadata_of_packages_stages_use(digits: Path, tmp_path: Path, cache_dir: Path) -> None:
    from importlib.metadata import version

    build(digits, tmp_path / "build")
    stamp_file = next((tmp_path / "build" / ".stamps").glob("*.json"))
    watched = json.loads(stamp_file.read_text())["read"]
    numpy_metadata = [p for p in watched if f"numpy-{version('numpy')}.dist-info" in p]
    assert numpy_metadata and Path(numpy_metadata[0]).name == "METADATA"


def _compiler_wrapper(folder: Path, version: str, compiler: str = "cc") -> Path:
    """A C compiler on PATH that reports `version` and compiles with the system's `compiler`."""
    folder.mkdir(exist_ok=True)
    wrapper = folder / f"wrapped-{compiler}"
    wrapper.write_text(f'#!/bin/sh\n[ "$1" = --version ] && {{ echo "{wrapper.name} {version}"; exit 0; }}\n'
                       f'exec {shutil.which(compiler)} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")
def test_compiler_upgrade_alone_reruns_the_check(
    digits: Path, tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No file of the recipe changes, only the compiler: both the no-op stamp and doit notice it."""
    tools = tmp_path / "tools"
    _compiler_wrapper(tools, "1.0")
    monkeypatch.setenv("PATH", f"{tools}:{__import__('os').environ['PATH']}")
    edit(digits, "options: {cflags: [-O2]}", "options: {cflags: [-O2], compiler: wrapped-cc}")
    build(digits, tmp_path / "build")
    assert executed(build(digits, tmp_path / "build")) == set()
    _compiler_wrapper(tools, "2.0")
    assert executed(build(digits, tmp_path / "build")) == {"check:mcu"}
    stamp_file = next((tmp_path / "build" / ".stamps").glob("*.json"))
    assert str(tools / "wrapped-cc") in json.loads(stamp_file.read_text())["read"]


@pytest.mark.skipif(shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
                    reason="needs gcc-arm-none-eabi, libnewlib-arm-none-eabi and qemu-system-arm")
def test_cross_compiler_upgrade_reruns_a_cortex_m_export_and_check(
    digits: Path, tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Cortex-M export links an image to measure it, so the cross compiler's identity is in its key too."""
    tools = tmp_path / "tools"
    _compiler_wrapper(tools, "1.0", "arm-none-eabi-gcc")
    monkeypatch.setenv("PATH", f"{tools}:{__import__('os').environ['PATH']}")
    edit(digits, "options: {cflags: [-O2]}",
         "options: {cflags: [-O2], cpu: cortex-m4, compiler: wrapped-arm-none-eabi-gcc}")
    build(digits, tmp_path / "build")
    _compiler_wrapper(tools, "2.0", "arm-none-eabi-gcc")
    assert executed(build(digits, tmp_path / "build")) == {"export:mcu", "check:mcu"}


def test_switching_the_native_kernels_off_reruns_the_stages_that_use_the_interpreter(
    digits: Path, tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dabuild.ir.kernels.native import native_backend

    build(digits, tmp_path / "build")
    monkeypatch.setenv("DABUILD_NATIVE_KERNELS", "0")
    rerun = executed(build(digits, tmp_path / "build"))
    # The digits MLP has no conv, but the backend still enters the keys: the stages that run the interpreter rerun
    # unless the native kernels were unavailable in the first place (then nothing changed).
    monkeypatch.delenv("DABUILD_NATIVE_KERNELS")
    expected = set() if native_backend() == "numpy" else {"calibrate", "tune:c"}
    assert expected <= rerun and rerun <= {"calibrate", "tune:c", "export:mcu", "check:mcu"}


def test_goal_change_that_keeps_the_chosen_graph_reruns_tune_only(
    digits: Path, tmp_path: Path, cache_dir: Path
) -> None:
    """Early cutoff: tune runs again (its goal changed) but writes the same quantized graph, so the export and
    check keyed on that graph's digest stay up to date, though tune's report and metrics changed."""
    first = build(digits, tmp_path / "build")
    edit(digits, "tolerable_loss: 0.01", "tolerable_loss: 0.02")
    second = build(digits, tmp_path / "build")
    assert second["metrics"]["tune:c"]["config_hash"] == first["metrics"]["tune:c"]["config_hash"]
    assert second["metrics"]["tune:c"]["threshold"] != first["metrics"]["tune:c"]["threshold"]
    assert executed(second) == {"tune:c"}
    assert set(second["outcomes"].values()) == {"executed", "up to date"}


def test_checks_run_the_default_sample_count_and_all_on_request(digits: Path, tmp_path: Path, cache_dir: Path) -> None:
    from dabuild.recipe import DEFAULT_CHECK_SAMPLES

    evaluation_rows = len(np.load(digits / "data.npz")["x_test"])
    assert evaluation_rows > DEFAULT_CHECK_SAMPLES
    first = build(digits, tmp_path / "build")
    assert first["checks"]["mcu"]["samples"] == DEFAULT_CHECK_SAMPLES
    edit(digits, "check_io: {tolerance: exact}", "check_io: {tolerance: exact, samples: all}")
    every = build(digits, tmp_path / "build")
    assert executed(every) == {"check:mcu"} and every["checks"]["mcu"]["samples"] == evaluation_rows


def test_report_into_a_closed_pipe_ends_without_a_traceback(digits: Path, tmp_path: Path, cache_dir: Path) -> None:
    """`dabuild report | head`: the reader goes away before the report is written; dabuild stops quietly."""
    build(digits, tmp_path / "build")
    command = [sys.executable, "-m", "dabuild", "report", str(digits), "--build-dir", str(tmp_path / "build"), "-q"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # before dabuild writes anything: every write meets a closed pipe
    errors = process.stderr.read().decode()
    assert process.wait(timeout=120) == 0 and errors == ""
