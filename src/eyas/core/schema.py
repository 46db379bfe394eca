"""Typed dataclasses from plain mappings: the checks behind the config schema (`eyas.config`).

`build(cls, values, key)` turns a mapping (a parsed YAML file, Snakemake's `config`, a rule's params)
into the dataclass `cls`, nested dataclasses included: unknown keys, missing required keys and wrong
types are refused naming the key (`train.lr`, `evaluate.sets[0].format`), floats must be finite, and
the bounds `bounded` puts on a field are checked. `from_command_line` first types the strings of
`snakemake --config` values the way the schema wants them. `field_docs` reads a field's docstring.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import field
from typing import Any, Literal, get_args, get_origin

import yaml


class ConfigError(ValueError):
    """A config value the schema refuses; the message names the key."""


Bound = float | None


def bounded(
    default: Any = dataclasses.MISSING,
    *,
    ge: Bound = None,
    gt: Bound = None,
    lt: Bound = None,
    le: Bound = None,
    off: float | None = None,
    default_factory: Any = dataclasses.MISSING,
):
    """A numeric settings field with bounds (`ge` <= v <= `le`, `gt` < v < `lt`; on each item of a
    list), checked at config load. `off`: one value outside them with a meaning its docstring states
    (e.g. -1 = off). NaN and infinities are refused everywhere (`_check`)."""
    return field(default=default, default_factory=default_factory, metadata={"bounds": (ge, gt, lt, le, off)})


def _shape_of(value: Any) -> str:
    return "mapping" if isinstance(value, dict) else "list" if isinstance(value, list) else "scalar"


def _option_shape(option: Any) -> str:
    if dataclasses.is_dataclass(option) or get_origin(option) is dict:
        return "mapping"
    return "list" if get_origin(option) is list else "scalar"


def _describe(option: Any) -> str:
    """What a schema type accepts, in an error message's words."""
    if get_origin(option) is Literal:
        return "one of " + ", ".join(map(str, get_args(option)))
    if dataclasses.is_dataclass(option):
        return "a mapping {" + ", ".join(f.name for f in dataclasses.fields(option)) + "}"
    names = {bool: "true/false", int: "an integer", float: "a number", str: "a string"}
    return names.get(option) or {list: "a list", dict: "a mapping"}.get(get_origin(option), str(option))


def _check_union(value: Any, hint: Any, key: str) -> Any:
    """A union key: the option of the value's shape (mapping, list or scalar) checks it, so its error
    names the field that is wrong (`evaluate.sets[0].format`), not the union."""
    options = get_args(hint)
    if value is None:
        if type(None) in options:
            return None
        raise ConfigError(f"{key}: null is not allowed")
    options = [o for o in options if o is not type(None)]
    shaped = [o for o in options if _option_shape(o) == _shape_of(value)]
    nullable = " or null" if type(None) in get_args(hint) else ""
    expected = f"{key}: expected {' or '.join(_describe(o) for o in options)}{nullable}, got {value!r}"
    errors = []
    for option in shaped:
        try:
            return _check(value, option, key)
        except ConfigError as err:
            errors.append(err)
    if len(shaped) != 1:  # no option of the value's shape, or several that all refused it
        raise ConfigError(expected)
    others = [_describe(o) for o in options if o is not shaped[0]]
    if str(errors[0]).startswith(f"{key}:") and others:  # wrong here, not in a field further down
        raise ConfigError(f"{errors[0]} (or {' or '.join(others)})") from None
    raise errors[0]


def _check(value: Any, hint: Any, key: str) -> Any:
    origin = get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return _check_union(value, hint, key)
    if origin is Literal:
        if value not in get_args(hint):
            raise ConfigError(f"{key}: {value!r} is not {_describe(hint)}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {type(value).__name__} {value!r}")
        (item,) = get_args(hint)
        return [_check(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__}")
        return value
    if dataclasses.is_dataclass(hint):
        return build(hint, value, key)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true/false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"{key}: expected a finite number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{key}: unsupported schema type {hint!r}")


def build(cls: type, values: Any, key: str):
    """The dataclass `cls` from the mapping `values` (null = all defaults), checked; `key` is where
    the mapping sits in the config (`train`, `evaluate.sets[0]`), for error messages."""
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise ConfigError(f"{key or 'config'}: expected a mapping, got {type(values).__name__}")
    prefix = f"{key}." if key else ""
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"unknown config key {prefix}{unknown[0]} (known: {', '.join(sorted(known))})")
    kwargs = {}
    for name, value in values.items():
        kwargs[name] = _check(value, hints[name], f"{prefix}{name}")
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.name not in kwargs
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"{key or 'config'}: missing required key {missing[0]}")
    _check_bounds(cls, kwargs, key)
    return cls(**kwargs)


def field_bounds(f: dataclasses.Field) -> tuple[Bound, Bound, Bound, Bound, float | None]:
    """(ge, gt, lt, le, off) of a field made by `bounded`; all None for any other field."""
    return f.metadata.get("bounds", (None, None, None, None, None))


def _interval(ge: Bound, gt: Bound, lt: Bound, le: Bound) -> str:
    low = f"[{ge}" if ge is not None else f"({gt}" if gt is not None else "(-inf"
    high = f"{le}]" if le is not None else f"{lt})" if lt is not None else "inf)"
    return f"{low}, {high}"


def _check_bounds(cls: type, values: dict, key: str) -> None:
    """The bounds `bounded` put on fields, for the numbers given (on each item of a list; null, and a
    choice such as `auto` beside the number, pass: the field's docstring says what they mean)."""
    for f in dataclasses.fields(cls):
        ge, gt, lt, le, off = field_bounds(f)
        value, name = values.get(f.name), f"{key}.{f.name}" if key else f.name
        items = list(enumerate(value)) if isinstance(value, list) else [(None, value)]
        for i, item in items:
            if isinstance(item, bool) or not isinstance(item, int | float) or item == off:
                continue
            where = name if i is None else f"{name}[{i}]"
            allowed = _interval(ge, gt, lt, le) + (f", or {off}" if off is not None else "")
            for bad, rule in (
                (ge is not None and item < ge, f">= {ge}"),
                (gt is not None and item <= gt, f"> {gt}"),
                (le is not None and item > le, f"<= {le}"),
                (lt is not None and item >= lt, f"< {lt}"),
            ):
                if bad:
                    raise ConfigError(f"{where} must be {rule}, got {item} (allowed: {allowed})")


# --------------------------------------------------------------------------- `snakemake --config`
# Snakemake reads a `--config key=value` value with int, float, its bool parser, then YAML's BaseLoader
# (snakemake/cli.py `parse_config`), so a top-level value is typed but every scalar nested in a mapping
# or list stays a string: `--config "train={epochs: 1}"` arrives as {"train": {"epochs": "1"}}. Those
# values, and only those (a config file's are typed by YAML already and stay strict), are read here as a
# YAML scalar wherever the schema wants something other than a string: `1` -> 1, `1.5` / `1e-3` -> float,
# `true` / `false` -> bool, `null` / `~` -> None (also for a nullable string key). A string the schema
# accepts as it is (a path, a model id, a `Literal` choice) is kept as typed, quotes and all.
_YAML_NULLS = frozenset({"null", "Null", "NULL", "~"})


def _accepts_string(hint: Any, value: str) -> bool:
    origin = get_origin(hint)
    if hint is str or hint is Any:
        return True
    if origin is Literal:
        return value in get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_accepts_string(option, value) for option in get_args(hint))
    return False


def _yaml_scalar(text: str, hint: Any) -> Any:
    """`text` read as a YAML scalar (safe loader); kept as the string if it is not one."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str) and hint is float:  # PyYAML's float needs a dot: `1e-3` stays a string
        try:
            return float(text)
        except ValueError:
            return text
    return value if value is None or isinstance(value, bool | int | float | str) else text


def from_command_line(value: Any, hint: Any) -> Any:
    """Type the strings of a `--config` value the way the schema `hint` at that key wants them."""
    origin = get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [o for o in get_args(hint) if o is not type(None)]
        if isinstance(value, str) and value in _YAML_NULLS and type(None) in get_args(hint):
            return None
        if isinstance(value, str) and _accepts_string(hint, value):
            return value
        for option in options:  # the option whose shape matches the value's (mapping, list, scalar)
            if isinstance(value, dict) and (dataclasses.is_dataclass(option) or get_origin(option) is dict):
                return from_command_line(value, option)
            if isinstance(value, list) and get_origin(option) is list:
                return from_command_line(value, option)
        return from_command_line(value, options[0]) if len(options) == 1 else value
    if isinstance(value, dict):
        if dataclasses.is_dataclass(hint):
            hints = typing.get_type_hints(hint)
            return {k: from_command_line(v, hints[k]) if k in hints else v for k, v in value.items()}
        if origin is dict:
            item = get_args(hint)[1] if get_args(hint) else Any
            return {k: from_command_line(v, item) for k, v in value.items()}
        return value
    if isinstance(value, list):
        item = get_args(hint)[0] if origin is list and get_args(hint) else Any
        return [from_command_line(v, item) for v in value]
    if isinstance(value, str) and hint is Any:  # free-form mappings (engine_args): YAML scalars
        return _yaml_scalar(value, hint)
    if isinstance(value, str) and not _accepts_string(hint, value):
        return _yaml_scalar(value, hint)
    return value


def overlay(base: Any, top: Any) -> Any:
    """`top` over `base` the way Snakemake merges `--config` into the config: mappings key by key,
    anything else replaced."""
    if isinstance(base, dict) and isinstance(top, dict):
        return {**base, **{k: overlay(base.get(k), v) for k, v in top.items()}}
    return top


def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a settings dataclass (used by the docs test: every key documented)."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(cls))
    docs, last = {}, None
    for node in tree.body[0].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            last = node.target.id
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and last:
            docs[last] = str(node.value.value)
            last = None
    return docs
