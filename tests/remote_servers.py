"""Real remote-cache servers on localhost, started and stopped by the tests: OpenSSH's sshd and moto's S3.

sshd runs with a configuration, host key and authorized key of its own in a
temporary folder; the client side is a HOME of its own (~/.ssh/config, key,
known_hosts), as a user's would be. moto's threaded server speaks the S3 API;
the client finds it through the standard AWS_* variables.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SSHD = "/usr/sbin/sshd"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_for_port(port: int, process: subprocess.Popen | None = None, seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing answered on port {port} within {seconds}s")


def sshd_missing() -> str | None:
    if not Path(SSHD).exists() or shutil.which("ssh-keygen") is None:
        return "openssh-server is not installed (apt-get install openssh-server)"
    return None


@contextmanager
def sftp_server(folder: Path) -> Iterator[tuple[int, Path]]:
    """sshd on a free localhost port; yields (port, the client's HOME). Key login only, sftp only."""
    folder.mkdir(parents=True, exist_ok=True)
    home = folder / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    host_key, client_key = folder / "host_key", home / ".ssh" / "id_ed25519"
    for key in (host_key, client_key):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    authorized = folder / "authorized_keys"
    shutil.copy(client_key.with_suffix(".pub"), authorized)
    port = free_port()
    config = folder / "sshd_config"
    config.write_text("\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {host_key}", f"PidFile {folder / 'sshd.pid'}",
        f"AuthorizedKeysFile {authorized}", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
        "PubkeyAuthentication yes", "PermitRootLogin prohibit-password", "StrictModes no", "UsePAM no",
        "Subsystem sftp internal-sftp", "",
    ]))
    if os.getuid() == 0:
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation folder, made by its service script
    host_public = host_key.with_suffix(".pub").read_text().split()
    (home / ".ssh" / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_public[0]} {host_public[1]}\n")
    with open(folder / "sshd.log", "wb") as log:
        process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=subprocess.DEVNULL, stderr=log)
        try:
            _wait_for_port(port, process)
            yield port, home
        finally:
            process.terminate()
            process.wait(timeout=10)


@contextmanager
def s3_server() -> Iterator[int]:
    """moto's S3 server on a free localhost port."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        _wait_for_port(port)
        yield port
    finally:
        server.stop()
