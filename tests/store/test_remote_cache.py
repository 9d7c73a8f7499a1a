"""The team's remote cache: a second clone restores every stage from file://, SFTP (sshd) and S3 (moto)
remotes, and the trust model rejects what the team key did not sign or what does not hash right."""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import DIGITS

from dabuild import notices
from dabuild.cli import main
from dabuild.pipeline.hashing import hash_value
from dabuild.pipeline.manifest import Manifest
from dabuild.pipeline.remote import Remote
from dabuild.pipeline.remote_settings import RemoteSettings
from dabuild.pipeline.store import Store
from dabuild.trust import TeamKey
from tests.remote_servers import free_port, s3_server, sftp_server, sshd_missing

TEAM_KEY = "a-team-key-of-32-characters-xyz!"
# Every remote, file:// included, goes through fsspec: without dabuild[remote] a build warns and stays local.
needs_fsspec = pytest.mark.skipif(importlib.util.find_spec("fsspec") is None,
                                  reason="remotes need fsspec: pip install 'dabuild[remote]'")
STAGES = 5  # trace, calibrate, tune:c, export:mcu, check:mcu


@dataclass(frozen=True)
class ColdBuild:
    recipe: Path
    build_dir: Path
    cache: Path
    remote: Path  # the file:// remote the cold build pushed to


def _mcu_only_copy(folder: Path) -> Path:
    shutil.copytree(DIGITS, folder, ignore=shutil.ignore_patterns("build", "__pycache__"))
    recipe = folder / "recipe.yaml"
    text = recipe.read_text()
    recipe.write_text(text[: text.index("  - name: ort\n")])
    return folder


@pytest.fixture(scope="module")
def cold(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ColdBuild]:
    """One cold build of the example (C target) that pushes every stage to a file:// remote."""
    root = tmp_path_factory.mktemp("origin")
    built = ColdBuild(_mcu_only_copy(root / "digits"), root / "build", root / "cache", root / "remote")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DABUILD_CACHE", str(built.cache))
        env.setenv("DABUILD_CACHE_KEY", TEAM_KEY)
        env.setenv("DABUILD_REMOTE", f"file://{built.remote}")
        assert main(["build", str(built.recipe), "--build-dir", str(built.build_dir), "-q"]) == 0
    yield built


@pytest.fixture
def team(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A colleague's machine: the team key, an empty cache of its own."""
    monkeypatch.setenv("DABUILD_CACHE_KEY", TEAM_KEY)
    monkeypatch.setenv("DABUILD_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.delenv("DABUILD_REMOTE", raising=False)
    return tmp_path


def _artifacts(build_dir: Path) -> dict[str, bytes]:
    folder = build_dir / "digits-mlp"
    return {str(p.relative_to(folder)): p.read_bytes()
            for stage in ("export-mcu", "check-mcu", "tune-c", "trace") for p in sorted((folder / stage).rglob("*"))
            if p.is_file()}


def _clone_builds(tmp_path: Path, cold: ColdBuild, capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    """Build a second clone (another folder, empty cache); returns its summary line, artifacts checked."""
    clone = _mcu_only_copy(tmp_path / "clone" / "digits")
    capsys.readouterr()
    assert main(["build", str(clone), "--build-dir", str(tmp_path / "build"), "-q", *flags]) == 0
    summary = next(line for line in capsys.readouterr().out.splitlines() if " stages: " in line)
    assert _artifacts(tmp_path / "build") == _artifacts(cold.build_dir)
    return summary


def _restored_everything(summary: str) -> bool:
    return f"0 executed, 0 restored from cache, {STAGES} restored from the remote" in summary


@needs_fsspec
def test_second_clone_restores_every_stage_from_a_file_remote(
        cold: ColdBuild, team: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("DABUILD_REMOTE", f"file://{cold.remote}")
    assert _restored_everything(_clone_builds(team, cold, capsys))


def _push_from_origin(cold: ColdBuild, monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    """`dabuild cache push` of the cold build's entries, from the origin's cache, to `url`."""
    with monkeypatch.context() as origin:
        origin.setenv("DABUILD_CACHE", str(cold.cache))
        origin.setenv("DABUILD_REMOTE", url)
        assert main(["cache", "push", str(cold.recipe), "--build-dir", str(cold.build_dir), "-q"]) == 0


@pytest.mark.slow  # an SFTP round trip per file: about 15 s
@pytest.mark.skipif(sshd_missing() is not None, reason=sshd_missing() or "")
def test_second_clone_restores_every_stage_from_an_sftp_remote(
        cold: ColdBuild, team: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("sshfs", reason="the sftp extra is not installed (pip install 'dabuild[sftp]')")
    with sftp_server(team / "sshd") as (port, home):
        monkeypatch.setenv("HOME", str(home))  # the client's ~/.ssh: key, known_hosts
        url = f"sftp://127.0.0.1:{port}{team / 'sftp-remote'}"
        _push_from_origin(cold, monkeypatch, url)
        assert any((team / "sftp-remote" / "v1" / "ac").rglob("*.json"))
        monkeypatch.setenv("DABUILD_REMOTE", url)
        assert _restored_everything(_clone_builds(team, cold, capsys))


@pytest.mark.slow  # moto's server answers each request in Python: about 15 s
def test_second_clone_restores_every_stage_from_an_s3_remote(
        cold: ColdBuild, team: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e '.[test]')")
    import boto3

    with s3_server() as port:
        for name, value in (("AWS_ACCESS_KEY_ID", "team"), ("AWS_SECRET_ACCESS_KEY", "secret"),
                            ("AWS_DEFAULT_REGION", "us-east-1"), ("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")):
            monkeypatch.setenv(name, value)
        boto3.client("s3").create_bucket(Bucket="team-cache")
        _push_from_origin(cold, monkeypatch, "s3://team-cache/dabuild")
        monkeypatch.setenv("DABUILD_REMOTE", "s3://team-cache/dabuild")
        assert _restored_everything(_clone_builds(team, cold, capsys))


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@needs_fsspec
def test_a_tampered_blob_is_rejected_rebuilt_and_a_read_only_remote_is_never_written(
        cold: ColdBuild, team: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    remote = team / "remote"
    shutil.copytree(cold.remote, remote)
    check_record = next(r for r in (remote / "v1" / "ac").rglob("*.json")
                        if json.loads(r.read_text())["manifest"]["stage"] == "check")
    report = json.loads(check_record.read_text())["manifest"]["files"]["report.json"]["sha256"]
    blob = remote / "v1" / "cas" / report[:2] / report
    blob.write_bytes(blob.read_bytes().replace(b"true", b"tru3"))  # same size, other content
    before = _tree(remote)
    monkeypatch.setenv("DABUILD_REMOTE", f"file://{remote}")
    summary = _clone_builds(team, cold, capsys, "--no-push")
    assert f"1 executed, 0 restored from cache, {STAGES - 1} restored from the remote" in summary
    warned = json.loads((team / "build" / "digits-mlp" / "build.json").read_text())["warnings"]
    assert any("does not match its hash" in w and str(remote) in w for w in warned), warned
    assert _tree(remote) == before  # --no-push: nothing written, not even the stage that ran



@needs_fsspec
def test_a_project_s_push_false_holds_when_the_environment_names_the_remote(
        cold: ColdBuild, team: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    remote = team / "remote"
    shutil.copytree(cold.remote, remote)
    check_record = next(r for r in (remote / "v1" / "ac").rglob("*.json")
                        if json.loads(r.read_text())["manifest"]["stage"] == "check")
    check_record.unlink()  # the check stage runs, and a writable remote would get it
    before = _tree(remote)
    (team / "clone").mkdir()
    (team / "clone" / "dabuild-cache.yaml").write_text("remote: file:///nowhere\npush: false\n")
    monkeypatch.setenv("DABUILD_REMOTE", f"file://{remote}")  # names the remote, says nothing of pushing
    summary = _clone_builds(team, cold, capsys)
    assert f"1 executed, 0 restored from cache, {STAGES - 1} restored from the remote" in summary
    assert _tree(remote) == before


def test_read_only_wins_whichever_source_names_the_remote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dabuild.pipeline.remote_settings import load_settings

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("DABUILD_NO_PUSH", raising=False)
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.setenv("DABUILD_REMOTE", "file:///team/cache")
    assert load_settings(project) == RemoteSettings("file:///team/cache", True, None, "$DABUILD_REMOTE")
    (project / "dabuild-cache.yaml").write_text("push: false\n")
    settings = load_settings(project)
    assert settings is not None and settings.url == "file:///team/cache" and not settings.push
    (project / "dabuild-cache.yaml").write_text("remote: file:///team/cache\n")
    user_file = tmp_path / "config" / "dabuild" / "cache.yaml"
    user_file.parent.mkdir(parents=True)
    user_file.write_text("push: false\n")  # a laptop reads the team's cache and never writes it
    monkeypatch.delenv("DABUILD_REMOTE")
    settings = load_settings(project)
    assert settings is not None and settings.source == str(project / "dabuild-cache.yaml") and not settings.push
    user_file.write_text("push: true\n")
    settings = load_settings(project)
    assert settings is not None and settings.push


# -- the trust model on the store alone (fast) ------------------------------------------------------------

def _entry(tmp_path: Path, content: bytes = b"weights") -> tuple[Path, Manifest]:
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "weights.bin").write_bytes(content)
    parts = {"config": content.decode()}
    return folder, Manifest.of_folder(folder, "trace", hash_value(parts), parts)


def _remote(url: str, key: str = TEAM_KEY, push: bool = True) -> Remote:
    return Remote(RemoteSettings(url, push, None, "test"), TeamKey(key.encode(), "test"))


@needs_fsspec
def test_a_manifest_forged_without_the_team_key_is_rejected(tmp_path: Path) -> None:
    folder, manifest = _entry(tmp_path)
    url = f"file://{tmp_path / 'remote'}"
    with notices.collect() as warned:
        assert _remote(url, key="someone-else-entirely-0123").push(folder, manifest)
        assert _remote(url).fetch(manifest.key, tmp_path / "dest") is None
    assert any("not signed by the team key" in w for w in warned)


def test_a_shared_folder_serves_only_signed_entries(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o775)  # group-writable: others may write it
    folder, manifest = _entry(tmp_path)
    key = TeamKey(TEAM_KEY.encode(), "test")
    Store(shared, key).save(folder, manifest)
    (tmp_path / "dest").mkdir()
    assert Store(shared, key).restore(manifest.key, tmp_path / "dest") == manifest
    # another writer rewrites the entry *and* its manifest, consistently, without the key
    entry = shared / "v1" / "entries" / manifest.key[:2] / manifest.key
    entry.chmod(0o755)
    (entry / "weights.bin").chmod(0o644)
    (entry / "weights.bin").write_bytes(b"malware")
    (entry / ".manifest.json").chmod(0o644)
    Manifest.of_folder(entry, "trace", manifest.key, manifest.parts).write(entry)
    shutil.rmtree(tmp_path / "dest")
    (tmp_path / "dest").mkdir()
    with notices.collect() as warned:
        assert Store(shared, key).restore(manifest.key, tmp_path / "dest") is None
        assert not Store(shared, None).lookup(manifest.key)  # without a key a shared folder is not read
    assert any("not signed by the team key" in w for w in warned)
    assert any("no team key is set" in w for w in warned)


def test_a_shared_folder_keeps_only_signed_trial_scores(tmp_path: Path) -> None:
    """Trial scores in a run cache others may write carry the team key's signature: a score another writer
    rewrote with the plain hash an unshared cache uses is dropped; without a key the cache is not read."""
    from dabuild.tune.evaluate import Score
    from dabuild.tune.trials import TrialStore

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o775)  # group-writable: others may write it
    store = Store(shared, TeamKey(TEAM_KEY.encode(), "test"))
    context, config, score = "ab" * 32, "cd" * 32, Score(0.97, 0.001, 0.5)
    TrialStore(store.trials_root, context, key=store.trials_key).put(config, score)
    assert TrialStore(store.trials_root, context, key=store.trials_key).get(config) == score
    TrialStore(store.trials_root, context).put(config, Score(1.0, 0.0, 0.5))  # a flattering score, unkeyed
    with notices.collect() as warned:
        assert TrialStore(store.trials_root, context, key=store.trials_key).get(config) is None
        assert not Store(shared, None).readable
    assert any("not signed by the team key" in w for w in warned)


def test_a_read_only_remote_is_never_written(tmp_path: Path) -> None:
    folder, manifest = _entry(tmp_path)
    (tmp_path / "remote").mkdir()
    assert not _remote(f"file://{tmp_path / 'remote'}", push=False).push(folder, manifest)
    assert not any((tmp_path / "remote").iterdir())


def _push(url: str, folder: str, manifest: dict) -> bool:
    return _remote(url).push(Path(folder), Manifest(**manifest))


@needs_fsspec
def test_two_concurrent_pushes_leave_a_consistent_remote(tmp_path: Path) -> None:
    folder, manifest = _entry(tmp_path, b"x" * 3_000_000)
    url = f"file://{tmp_path / 'remote'}"
    from dataclasses import asdict

    with multiprocessing.get_context("spawn").Pool(2) as pool:
        assert all(pool.starmap(_push, [(url, str(folder), asdict(manifest))] * 4))
    assert not any((tmp_path / "remote" / "v1" / "tmp").iterdir())
    (tmp_path / "dest").mkdir()
    assert _remote(url).fetch(manifest.key, tmp_path / "dest") == manifest


def test_an_unreachable_remote_is_one_warning_within_seconds(tmp_path: Path) -> None:
    pytest.importorskip("sshfs")
    remote = _remote(f"sftp://127.0.0.1:{free_port()}/cache")
    start = time.monotonic()
    with notices.collect() as warned:
        assert remote.fetch("ab" * 32, tmp_path) is None
        assert remote.fetch("cd" * 32, tmp_path) is None
    assert time.monotonic() - start < 15
    assert len(warned) == 1 and "unreachable" in warned[0] and "building with the local cache only" in warned[0]


@pytest.mark.skipif(sshd_missing() is not None, reason=sshd_missing() or "")
def test_bad_credentials_are_one_line_naming_the_remote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("sshfs", reason="the sftp extra is not installed (pip install 'dabuild[sftp]')")
    with sftp_server(tmp_path / "sshd") as (port, home):
        (home / ".ssh" / "id_ed25519").unlink()  # a client whose key the server does not know
        (home / ".ssh" / "id_ed25519.pub").unlink()
        import subprocess

        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(home / ".ssh" / "id_ed25519")],
                       check=True)
        monkeypatch.setenv("HOME", str(home))
        url = f"sftp://127.0.0.1:{port}/cache"
        with notices.collect() as warned:
            assert _remote(url).fetch("ab" * 32, tmp_path) is None
    assert len(warned) == 1 and url in warned[0] and "access denied" in warned[0], warned


def test_a_missing_backend_names_the_pip_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "s3fs", None)  # as if the s3 extra were not installed
    with notices.collect() as warned:
        assert _remote("s3://bucket/cache").fetch("ab" * 32, tmp_path) is None
    assert "pip install 'dabuild[s3]'" in warned[0]


def test_an_unknown_protocol_is_a_validation_error_at_its_line(
        tmp_path: Path, team: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clone = _mcu_only_copy(tmp_path / "project" / "digits")
    (tmp_path / "project" / "dabuild-cache.yaml").write_text("push: true\nremote: gs://bucket/cache\n")
    assert main(["cache", "status", str(clone)]) == 2
    error = capsys.readouterr().err
    assert "dabuild-cache.yaml:2:9: unknown remote protocol 'gs'" in error
    assert "supported: file://, s3://, sftp://, ssh://" in error


@needs_fsspec
def test_a_second_machine_reuses_the_team_s_trial_scores_and_only_signed_ones(tmp_path: Path) -> None:
    from dabuild.tune.evaluate import Score
    from dabuild.tune.trials import TrialStore

    url, context = f"file://{tmp_path / 'remote'}", "ab" * 32
    score = Score(0.97, 0.001, 0.5)
    TrialStore(tmp_path / "first", context, _remote(url)).put("cd" * 32, score)
    assert TrialStore(tmp_path / "second", context, _remote(url)).get("cd" * 32) == score
    assert (tmp_path / "second" / context[:2] / context / f"{'cd' * 32}.json").is_file()  # kept locally too
    TrialStore(tmp_path / "forger", context, _remote(url, key="someone-else-entirely-0123")).put("ef" * 32, score)
    with notices.collect() as warned:
        assert TrialStore(tmp_path / "third", context, _remote(url)).get("ef" * 32) is None
    assert any("not signed by the team key" in w for w in warned)
