"""The build folder is dabuild's own: nothing is written or deleted through a link dabuild did not make.

A project may ship `build -> ../elsewhere`, or a pre-made `build/<name>` or
`build/<name>/trace` link; following it, stage folders, `.doit.db` and stamps
would be written outside, and `dabuild clean` would delete what the link points
to. So the build root and each recipe's folder must be real folders (an error
naming the link otherwise), a link inside the folder may only point inside it
(dabuild makes such links itself: report/<capability>), and removal unlinks a
link instead of descending into it (`shutil.rmtree` removes trees with
`dir_fd`/`O_NOFOLLOW` on Linux, and refuses a link at the top).

The folders above the build root are the user's choice (/tmp may itself be a link).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from dabuild.errors import UsageError
from dabuild.pipeline.stamp import STAMPS


def _refuse_link(path: Path, what: str) -> None:
    if path.is_symlink():
        raise UsageError(f"{path}: the {what} is a symbolic link (to {os.readlink(path)}); dabuild writes and "
                         "deletes only in folders it made, never through a link: remove the link, or choose "
                         "another --build-dir")


def build_root(root: Path) -> Path:
    """`root` made absolute (not resolved); UsageError if it is a symbolic link."""
    absolute = Path(os.path.abspath(root))
    _refuse_link(absolute, "build folder")
    return absolute


def build_dir(root: Path, name: str) -> Path:
    """The build folder of recipe `name`; UsageError if it, the root or the root's stamp folder is a link."""
    folder = build_root(root) / name
    _refuse_link(folder, "build folder")
    _refuse_link(folder.parent / STAMPS, "stamp folder")
    return folder.parent.resolve() / name


def refuse_links_out(folder: Path) -> None:
    """UsageError naming the first link under `folder` whose target lies outside it (checked before a build
    writes anything there)."""
    if not folder.is_dir():
        return
    inside = folder.resolve()
    for parent, directories, files in os.walk(folder):  # os.walk does not descend into linked folders
        for name in (*directories, *files):
            path = Path(parent, name)
            if path.is_symlink() and not path.resolve().is_relative_to(inside):
                raise UsageError(f"{path}: a symbolic link in the build folder points outside it (to "
                                 f"{os.readlink(path)}); dabuild did not make it and will not write through it: "
                                 "remove it (dabuild clean removes links, never what they point to)")


def remove(path: Path) -> None:
    """Remove `path`: a link or file is unlinked, a folder removed without following any link inside it."""
    if path.is_symlink() or not path.is_dir():
        path.unlink()
    else:
        shutil.rmtree(path)
