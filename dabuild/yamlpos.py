"""Safe YAML loading that remembers where every key and value came from.

A recipe error is only useful if it points at the line the user has to edit,
so files are *composed* (never constructed into arbitrary objects) and turned
into plain dicts, lists and scalars while recording the 1-based (line, column)
of every key and every value under its path tuple, e.g. ("targets", 0, "kind").

The same module turns pydantic's validation errors into `file:line:col:`
diagnostics, because only it knows how a pydantic `loc` maps onto the file.
"""

from __future__ import annotations

import difflib
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Protocol, Union, get_args, get_origin

import yaml

from dabuild.errors import Diagnostic, ValidationError
from dabuild.userpaths import PathProblem, checked_path

if TYPE_CHECKING:
    from pydantic import BaseModel

Loc = tuple[Any, ...]
Position = tuple[int, int]

# Aliases can expand a small file into an enormous tree ("billion laughs");
# no honest recipe comes near this many nodes, this depth or this size.
MAX_NODES = 100_000
MAX_DEPTH = 50
MAX_YAML_BYTES = 1024**2

# Errors raised by dabuild's own validators carry this pydantic error type;
# their message is already written for the user and is shown unchanged.
USER_ERROR = "dabuild"


def user_error(message: str, at_key: bool = False) -> Exception:
    """A pydantic error whose message reaches the user verbatim; `at_key` points at the key, not the value."""
    from pydantic_core import PydanticCustomError

    return PydanticCustomError(USER_ERROR, "{message}", {"message": message, "at_key": at_key})


@dataclass
class YamlDocument:
    """Plain data of one YAML file plus the position of every key and value."""

    file: str
    data: Any
    values: dict[Loc, Position] = field(default_factory=dict)
    keys: dict[Loc, Position] = field(default_factory=dict)
    problems: list[Diagnostic] = field(default_factory=list)  # non-fatal: duplicate keys

    def position(self, loc: Loc, key: bool = False) -> Position:
        """Position of `loc`, or of its nearest known ancestor; the key's when `key` is set."""
        loc = tuple(loc)
        while True:
            if key and loc in self.keys:
                return self.keys[loc]
            if loc in self.values:
                return self.values[loc]
            if not loc:
                return (1, 1)
            loc = loc[:-1]

    def diagnostic(self, loc: Loc, message: str, key: bool = False) -> Diagnostic:
        line, col = self.position(loc, key)
        return Diagnostic(self.file, line, col, message)


def load_yaml(path: Path | str) -> YamlDocument:
    """Read one YAML document with positions; ValidationError if it cannot be read or parsed."""
    file = str(path)
    try:
        checked_path(path, max_bytes=MAX_YAML_BYTES)
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValidationError([Diagnostic(file, None, None, "file not found")]) from None
    except PathProblem as problem:
        message = "file not found" if str(problem).startswith("file not found") else str(problem)
        raise ValidationError([Diagnostic(file, None, None, message)]) from None
    except UnicodeDecodeError as exc:
        raise ValidationError([_not_text(file, exc)]) from None
    except OSError as exc:
        raise ValidationError([Diagnostic(file, None, None, f"cannot read: {exc.strerror}")]) from None
    return parse_yaml(text, file)


def _not_text(file: str, error: UnicodeDecodeError) -> Diagnostic:
    """Where the first byte that is not UTF-8 sits, and whether the file looks binary altogether."""
    data: bytes = error.object if isinstance(error.object, bytes) else bytes(error.object)
    line = data.count(b"\n", 0, error.start) + 1
    col = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
    kind = "a binary file, not YAML text" if b"\0" in data[:8192] else "not UTF-8 text"
    return Diagnostic(file, line, col, f"{kind}: byte 0x{data[error.start]:02x} is not UTF-8 ({error.reason})")


def parse_yaml(text: str, file: str) -> YamlDocument:
    """Like `load_yaml`, for text already in memory; `file` names it in diagnostics.

    libyaml's parser, when present, makes the common case (a valid file) several
    times faster; a file it rejects is parsed again by PyYAML's own parser, so
    error messages read the same with or without libyaml.
    """
    fast = getattr(yaml, "CSafeLoader", None)
    if fast is not None:
        try:
            return _parse(fast, text, file)
        except yaml.YAMLError:
            pass
    try:
        return _parse(yaml.SafeLoader, text, file)
    except yaml.MarkedYAMLError as exc:
        raise ValidationError([_syntax_diagnostic(file, exc)]) from None
    except yaml.YAMLError as exc:
        raise ValidationError([Diagnostic(file, None, None, str(exc))]) from None


def _parse(loader_class: type, text: str, file: str) -> YamlDocument:
    _check_depth(loader_class, text, file)
    loader = loader_class(text)
    try:
        root = loader.get_single_node()
        document = YamlDocument(file, None)
        document.data = _Builder(loader, document).build(root, ()) if root is not None else None
        return document
    finally:
        loader.dispose()


def _check_depth(loader_class: type, text: str, file: str) -> None:
    """Refuse nesting deeper than MAX_DEPTH at its line, from the event stream (composing such a tree
    would recurse past Python's stack limit)."""
    depth = 0
    loader = loader_class(text)
    try:
        while loader.check_event():
            event = loader.get_event()
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_DEPTH:
                    assert event.start_mark is not None  # a loader's events carry their marks
                    line, col = _pos(event.start_mark)
                    raise ValidationError([Diagnostic(file, line, col, f"nested more than {MAX_DEPTH} levels "
                                                                       "deep; no recipe or capability needs that")])
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
    finally:
        loader.dispose()


def require_mapping(document: YamlDocument, what: str) -> dict:
    """The top level as a dict; ValidationError at 1:1 otherwise (an empty file included)."""
    if isinstance(document.data, dict):
        return document.data
    got = "an empty file" if document.data is None else f"a {_kind(document.data)}"
    raise ValidationError(
        [Diagnostic(document.file, 1, 1, f"the top level of {what} must be a mapping of keys, got {got}")]
    )


class _Builder:
    """Turns composed nodes into plain data, recording positions on the way."""

    def __init__(self, loader: yaml.SafeLoader, document: YamlDocument):
        self.loader = loader
        self.document = document
        self.count = 0
        self.active: set[int] = set()  # nodes being built: meeting one again means a recursive alias
        self.checked: set[int] = set()  # mappings already checked for duplicate keys

    def build(self, node: yaml.Node, loc: Loc) -> Any:
        self.count += 1
        if self.count > MAX_NODES:
            raise yaml.MarkedYAMLError(
                problem=f"document expands to more than {MAX_NODES} nodes (too many aliases?)",
                problem_mark=node.start_mark,
            )
        self.document.values[loc] = _pos(node.start_mark)
        if isinstance(node, yaml.ScalarNode):
            return self.scalar(node)
        _check_tag(node)
        if id(node) in self.active:
            raise yaml.MarkedYAMLError(problem="recursive alias", problem_mark=node.start_mark)
        self.active.add(id(node))
        try:
            if isinstance(node, yaml.SequenceNode):
                return [self.build(child, loc + (i,)) for i, child in enumerate(node.value)]
            assert isinstance(node, yaml.MappingNode)  # the third kind of node
            return self._mapping(node, loc)
        finally:
            self.active.discard(id(node))

    def scalar(self, node: yaml.ScalarNode) -> Any:
        _check_tag(node)
        try:
            return self.loader.construct_object(node, deep=True)
        except (ValueError, TypeError, OverflowError) as exc:  # e.g. a timestamp with month 13
            raise yaml.MarkedYAMLError(problem=f"invalid value {node.value!r}: {exc}",
                                       problem_mark=node.start_mark) from exc

    def _mapping(self, node: yaml.MappingNode, loc: Loc) -> dict:
        if id(node) not in self.checked:
            self.checked.add(id(node))
            self._report_duplicates(node)
            self.loader.flatten_mapping(node)  # resolves `<<: *anchor` merge keys in place
        result: dict = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise yaml.MarkedYAMLError(
                    problem="a mapping key must be a plain value, not a list or mapping",
                    problem_mark=key_node.start_mark,
                )
            key = self.scalar(key_node)
            self.document.keys[loc + (key,)] = _pos(key_node.start_mark)
            result[key] = self.build(value_node, loc + (key,))
        return result

    def _report_duplicates(self, node: yaml.MappingNode) -> None:
        first: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.scalar(key_node)
            if key in first:
                line, col = _pos(key_node.start_mark)
                self.document.problems.append(
                    Diagnostic(
                        self.document.file,
                        line,
                        col,
                        f"duplicate key {key!r} (first defined at line {_pos(first[key].start_mark)[0]})",
                    )
                )
            else:
                first[key] = key_node


_STANDARD = "tag:yaml.org,2002:"
# What each kind of node may be: plain YAML types only, never Python objects.
_PLAIN_TAGS = {
    yaml.ScalarNode: {_STANDARD + t for t in ("null", "bool", "int", "float", "str", "binary", "timestamp")},
    yaml.SequenceNode: {_STANDARD + "seq"},
    yaml.MappingNode: {_STANDARD + "map"},
}


def _check_tag(node: yaml.Node) -> None:
    if node.tag not in _PLAIN_TAGS[type(node)]:
        raise yaml.MarkedYAMLError(
            problem=f"unsupported tag {node.tag.replace(_STANDARD, '!!')!r}: only plain data is allowed",
            problem_mark=node.start_mark,
        )


class _Mark(Protocol):
    """A place in the text: pyyaml's pure-Python and C loaders have a Mark class each."""

    line: int
    column: int


def _pos(mark: _Mark) -> Position:
    return (mark.line + 1, mark.column + 1)


def _syntax_diagnostic(file: str, exc: yaml.MarkedYAMLError) -> Diagnostic:
    mark = exc.problem_mark or exc.context_mark
    problem = exc.problem or "invalid YAML"
    if "'\\t'" in problem:
        message = "tab character: YAML indentation must use spaces"
    else:
        message = f"invalid YAML: {problem}"
        if exc.context and exc.context_mark is not None and exc.context_mark is not mark:
            line, col = _pos(exc.context_mark)
            message += f" ({exc.context} started at {line}:{col})"
    if mark is None:
        return Diagnostic(file, None, None, message)
    line, col = _pos(mark)
    return Diagnostic(file, line, col, message)


def _kind(value: Any) -> str:
    return {list: "list", dict: "mapping", str: "string", bool: "boolean"}.get(type(value), type(value).__name__)


# ---------------------------------------------------------------- pydantic errors


def pydantic_diagnostics(
    document: YamlDocument, error: Any, model: type, prefix: Loc = ()
) -> list[Diagnostic]:
    """Positioned diagnostics for a pydantic ValidationError raised validating the data at `prefix`.

    `model` is the pydantic class validated there; it supplies the allowed keys
    for "unknown key ... (did you mean ...?)". Errors pydantic reports once per
    member of a union land on the same key and are merged into one line.
    """
    grouped: dict[tuple[Loc, str], list[dict]] = {}
    for item in error.errors(include_url=False):
        loc = _data_loc(document.data, prefix + tuple(item["loc"]), item["type"] == "missing")
        category = item["type"] if item["type"] in ("missing", "extra_forbidden", USER_ERROR) else "value"
        grouped.setdefault((loc, category if category == "value" else f"{category}:{id(item)}"), []).append(item)
    diagnostics = []
    for (loc, _), items in grouped.items():
        kind = items[0]["type"]
        if kind == "extra_forbidden":
            parent_model = _model_at(model, loc[len(prefix) : -1])
            allowed = sorted(parent_model.model_fields) if parent_model else []
            diagnostics.append(document.diagnostic(loc, unknown_key_message(loc[-1], allowed), key=True))
        elif kind == "missing":
            where = f" in {dotted(loc[:-1])}" if loc[:-1] else ""
            diagnostics.append(document.diagnostic(loc, f"missing required key {loc[-1]!r}{where}", key=True))
        elif kind == USER_ERROR:
            at_key = bool(items[0].get("ctx", {}).get("at_key"))
            diagnostics.append(document.diagnostic(loc, items[0]["msg"], key=at_key))
        else:
            diagnostics.append(document.diagnostic(loc, _value_message(loc, items)))
    return diagnostics


def unknown_key_message(key: Any, allowed: list[str]) -> str:
    """`unknown key 'tunning' (did you mean 'tuning'?)`, or the allowed keys when nothing is close."""
    message = f"unknown key {key!r}"
    close = difflib.get_close_matches(str(key), allowed, n=1)
    if close:
        return message + f" (did you mean {close[0]!r}?)"
    return message + ("; allowed: " + ", ".join(allowed) if allowed else "")


def dotted(loc: Loc) -> str:
    """("targets", 0, "kind") -> "targets[0].kind"."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _data_loc(data: Any, loc: Loc, missing: bool) -> Loc:
    """`loc` without pydantic's own entries (union member names, validator tags) that are not in the file."""
    kept: list[Any] = []
    for i, part in enumerate(loc):
        if (isinstance(data, dict) and part in data) or (
                isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data)):
            data = data[part]
        elif missing and i == len(loc) - 1:
            pass
        else:
            continue
        kept.append(part)
    return tuple(kept)


# pydantic's words for some errors, in YAML's terms.
_PLAIN_MESSAGES = {
    "dict_type": "Input should be a mapping",
    "model_type": "Input should be a mapping",
    "model_attributes_type": "Input should be a mapping",
    "list_type": "Input should be a list",
}


def _item_message(item: dict, alone: bool) -> str:
    if item["type"] == "too_short" and item.get("ctx", {}).get("min_length") == 1:
        return "Must not be empty"
    if alone and item["type"] == "string_type" and isinstance(item.get("input"), (int, float)):
        return "Input should be a string, so quote it"
    return _PLAIN_MESSAGES.get(item["type"], item["msg"])


def _value_message(loc: Loc, items: list[dict]) -> str:
    # For a union, a member whose type matched but whose constraint failed says what is wrong;
    # the other members' "should be a <type>" only add noise.
    items = [item for item in items if not item["type"].endswith("_type")] or items
    messages = [_item_message(item, len(items) == 1) for item in items]
    lead = "Input should be "
    if len(messages) > 1 and all(m.startswith(lead) for m in messages):
        text = lead + " or ".join(dict.fromkeys(m[len(lead) :] for m in messages))
    else:
        text = "; ".join(dict.fromkeys(messages))
    text = text[0].lower() + text[1:]
    value = items[0].get("input")
    if isinstance(value, (str, int, float, bool)) or value is None:
        shown = repr(value)
        text += f" (got {shown if len(shown) <= 40 else shown[:37] + '...'})"
    return f"{dotted(loc)}: {text}" if loc else text


def _model_at(annotation: Any, loc: Loc) -> type[BaseModel] | None:
    """The pydantic model class that validates the data at `loc` below `annotation`, if any."""
    for part in loc:
        annotation = _child(annotation, part)
        if annotation is None:
            return None
    return _first(annotation, lambda a: a if _is_model(a) else None)


def _child(annotation: Any, part: Any) -> Any:
    def step(a: Any) -> Any:
        if _is_model(a):
            field_info = a.model_fields.get(part)
            return field_info.annotation if field_info else None
        origin = get_origin(a)
        if origin is list and isinstance(part, int):
            return get_args(a)[0]
        if origin is dict:
            return get_args(a)[1]
        return None

    return _first(annotation, step)


def _first(annotation: Any, pick: Any) -> Any:
    """`pick` applied through Annotated[...] and unions: the first non-None answer."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _first(get_args(annotation)[0], pick)
    if origin in (Union, types.UnionType):
        for arg in get_args(annotation):
            found = _first(arg, pick)
            if found is not None:
                return found
        return None
    return pick(annotation)


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and hasattr(annotation, "model_fields")
