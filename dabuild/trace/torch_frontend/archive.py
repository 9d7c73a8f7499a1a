"""A torch.export archive (.pt2) vetted part by part before torch reads it, so it cannot run code.

`torch.export.load` runs code from the file in three ways: it unpickles the
sample inputs, any weight or constant marked `use_pickle` and the old format's
`.pt` parts with `weights_only=False` (serde/serialize.py falls back to it when
`weights_only=True` fails; pt2_archive/_package.py never tries anything else),
it unpickles custom and opaque objects outright (`pickle.loads`), and it hands
every symbolic shape expression of the graph to `sympy.sympify`, which
`eval`s it. Node targets are looked up by `getattr` from `torch`, `math` or
`_operator`, so `torch.os.system` would be a node. So the archive is read into
memory once, every part torch would unpickle must load under
`torch.load(weights_only=True)` (plain tensors and containers only), custom
and opaque objects are refused by name, every shape expression may use only
numbers, operators, symbols and sympy's function classes, and every node target
must be an operator; torch then reads the very bytes that were vetted.
"""

from __future__ import annotations

import io
import json
import re
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from dabuild.errors import UsageError
from dabuild.limits import check_zip_members

_UNPICKLED_CONFIGS = re.compile(r"(^|/)data/(weights|constants)/[^/]*_(weights|constants)_config\.json$")
_OBJECT_PREFIXES = ("custom_obj_", "opaque_obj_")  # torch's CUSTOM_OBJ_/OPAQUE_OBJ_FILENAME_PREFIX
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_EXPRESSION_CHARACTERS = re.compile(r"[A-Za-z0-9_+\-*/%(),<>=!&|~^. ]*")
_SYMBOL = re.compile(r"[a-z]+[0-9]+")  # torch's shape symbols: s0, u3, zf1
_SYMBOL_LITERAL = re.compile(r"'[a-z]+[0-9]+'")  # Symbol('s77', positive=True, integer=True)
_KEYWORD = re.compile(r"[(,]\s*[a-z_]+\s*=(?!=)")
_CONSTANT_NAMES = frozenset({"True", "False", "oo", "zoo", "nan", "pi", "E", "I"})
_TARGET = re.compile(r"(torch\.ops(\.[A-Za-z0-9_]+){2,3}|_operator\.[a-z_]+|math\.[a-z_0-9]+|torch\._?sym_[a-z_]+)")


def read_vetted(path: Path) -> bytes:
    """The bytes of `path` once every part torch would unpickle or evaluate passed; UsageError naming the part."""
    data = path.read_bytes()
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            check_zip_members(archive, path)
            for member, problem in _problems(archive):
                raise UsageError(f"{path}: part {member} {problem}; dabuild never unpickles or evaluates "
                                 "code from a model file (re-save the model with torch.export.save from plain "
                                 "tensors and aten ops)")
    except (zipfile.BadZipFile, OSError, ValueError, KeyError, AttributeError, TypeError) as error:
        raise UsageError(f"{path}: not a readable torch.export archive: {error}") from None
    return data


def _problems(archive: zipfile.ZipFile) -> Iterator[tuple[str, str]]:
    for name in archive.namelist():
        if name.endswith(".pt"):
            yield from _pickle_problem(archive, name)
        elif _UNPICKLED_CONFIGS.search(name):
            yield from _payload_problems(archive, name)
        elif name.endswith(".json"):  # models/<name>.json, or the old format's serialized_exported_program.json
            yield from _program_problems(archive, name)


def _pickle_problem(archive: zipfile.ZipFile, member: str) -> Iterator[tuple[str, str]]:
    """A pickled part that torch's restricted unpickler refuses (torch itself would retry it unrestricted)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns of pickle protocols its restricted unpickler may lack
            torch.load(io.BytesIO(archive.read(member)), map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - the restricted unpickler raises many types
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        why = next((line for line in lines if line.startswith("Unsupported")), "")
        yield member, "is a pickle that torch.load(weights_only=True) refuses" + (f" ({why})" if why else "")


def _payload_problems(archive: zipfile.ZipFile, config_name: str) -> Iterator[tuple[str, str]]:
    folder = config_name.rsplit("/", 1)[0]
    config = json.loads(archive.read(config_name)).get("config", {})
    for fqn, meta in config.items():
        path_name = str(meta.get("path_name", ""))
        if path_name.startswith(_OBJECT_PREFIXES):
            yield f"{folder}/{path_name} ({fqn})", "is a pickled Python object (torchbind or opaque), not a tensor"
        elif meta.get("use_pickle"):
            yield from _pickle_problem(archive, f"{folder}/{path_name}")


def _program_problems(archive: zipfile.ZipFile, member: str) -> Iterator[tuple[str, str]]:
    program = json.loads(archive.read(member))
    for key, value in _strings(program):
        if key == "expr_str" and not _safe_expression(value):
            yield member, f"has the shape expression {value[:80]!r}, which is not arithmetic over shape symbols"
        elif key == "target" and (not _TARGET.fullmatch(value) or "__" in value):
            yield member, f"calls {value[:80]!r}, which is not an operator (torch.ops, _operator, math)"


def _strings(node: Any, key: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(node, dict):
        for name, value in node.items():
            yield from _strings(value, name)
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value, key)
    elif isinstance(node, str):
        yield key, node


def _safe_expression(text: str) -> bool:
    """Only what torch writes: numbers, operators, quoted symbol names, keyword arguments (assumptions such as
    `positive=True`) and sympy's classes; no attribute access, no dunders, no other names."""
    import sympy  # type: ignore[import-untyped]
    import torch.utils._sympy.functions as torch_sympy

    text = _KEYWORD.sub("(", _SYMBOL_LITERAL.sub("0", text))
    if not _EXPRESSION_CHARACTERS.fullmatch(text) or "__" in text or re.search(r"\.\s*[A-Za-z_]", text):
        return False
    for name in _NAME.findall(text):
        if _SYMBOL.fullmatch(name) or name in _CONSTANT_NAMES:
            continue
        function = getattr(torch_sympy, name, None) or getattr(sympy, name, None)
        if not (isinstance(function, type) and issubclass(function, sympy.Basic)):
            return False
    return True
