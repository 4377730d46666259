"""Command-line flags and YAML files from a config dataclass, as TRL builds its CLI from ``GRPOConfig``.

Each field becomes ``--field-name``, its help the field's ``metadata["help"]``, so the flags never drift from
the code. Other metadata keys: ``choices`` (allowed values), ``required`` (the flag must be given), ``one_of``
(fields sharing this name form a group of which exactly one flag must be given) and ``metavar``; and, for the
commands whose flags predate their configs (``eval``, ``index``, ``bench``, ``env serve``, ``data``, ``play``,
``plot``, ``model get``): ``positional`` (an argument without a flag, e.g. ``env_id``; a list field takes one or
more), ``append`` (a repeatable flag collecting a list), ``type`` (the converter of the flag's text, e.g.
``port_number``) and ``exclusive`` (fields sharing this name form a group of which at most one flag may be given).

Two modes:

- ``explicit_only=True`` (``train``, ``model pretrain``): a flag not given is absent from the namespace, so a
  YAML file (``--config``) fills it and the dataclass default comes last. Precedence: flag > YAML > default.
- ``explicit_only=False`` (``sft``, ``model init``): a flag not given holds the field's default, which
  ``--help`` shows, and the namespace has every field.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from agent_gym.error import AgentGymError

__all__ = [
    "RENAMED_FIELDS",
    "add_dataclass_arguments",
    "config_from_dict",
    "config_from_namespace",
    "field_default",
    "load_config",
]

#: field names of earlier releases -> their current names (YAML keys and CLI flags keep working)
RENAMED_FIELDS = {"loss_mask": "use_loss_mask", "advantage_mask": "use_advantage_mask"}


def _strip_optional(tp: Any) -> tuple[Any, bool]:
    """(inner type, allows None) for `X | None`."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def field_default(f: dataclasses.Field) -> Any:
    """A field's default value (its factory called), or ``dataclasses.MISSING``."""
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _coerce(name: str, tp: Any, value: Any, error: type[AgentGymError]) -> Any:
    """Convert a YAML/CLI value to the field's type, or raise ``error`` naming the field."""
    inner, optional = _strip_optional(tp)
    if value is None or (optional and isinstance(value, str) and value.lower() in ("none", "null")):
        if optional:
            return None
        raise error(f"{name} may not be null")
    origin = typing.get_origin(inner)
    try:
        if origin is Literal:
            if value not in typing.get_args(inner):
                raise error(f"{name}={value!r} is not one of {', '.join(map(str, typing.get_args(inner)))}")
            return value
        if inner is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
                return value.lower() in ("true", "1", "yes")
            raise error(f"{name} must be true or false, got {value!r}")
        if origin is dict or inner is dict:
            if isinstance(value, str):
                value = json.loads(value)
            if not isinstance(value, dict):
                raise error(f"{name} must be a mapping (JSON object), got {value!r}")
            return dict(value)
        if origin is list or inner is list:
            if isinstance(value, str):
                value = [value]
            item = (typing.get_args(inner) or (str,))[0]
            return [item(v) for v in value]
        if inner is int and isinstance(value, float) and not value.is_integer():
            raise error(f"{name} must be an integer, got {value!r}")
        if inner in (int, float, str):
            return inner(value)
    except (TypeError, ValueError, json.JSONDecodeError) as problem:
        if isinstance(problem, AgentGymError):
            raise
        raise error(f"{name}: cannot read {value!r} as {getattr(inner, '__name__', inner)} ({problem})") from problem
    return value


def config_from_dict(values: dict[str, Any], cls: type) -> Any:
    """Build a ``cls`` from a mapping; unknown keys and ill-typed values raise the config's error type.

    A key in `RENAMED_FIELDS` is read as its new name; giving both names is an error.
    """
    from agent_gym.trainers.config import ConfigError  # here: it imports torch, which a command's --help need not

    error = ConfigError
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    values = dict(values)
    for old, new in RENAMED_FIELDS.items():
        if old in values and new in names:
            if new in values:
                raise error(f"{old} and {new} are both set; {old} is the old name of {new}: keep only {new}")
            values[new] = values.pop(old)
    unknown = sorted(set(values) - names)
    if unknown:
        raise error(f"unknown config field(s) {', '.join(unknown)}; valid fields: {', '.join(sorted(names))}")
    coerced = {key: _coerce(key, hints[key], value, error) for key, value in values.items()}
    try:
        return cls(**coerced)
    except AgentGymError:
        raise
    except (TypeError, ValueError) as problem:
        raise error(str(problem)) from problem


def load_config(path: str | Path | None, overrides: dict[str, Any] | None, cls: type) -> Any:
    """Load a YAML file of ``cls`` fields (if given) and apply `overrides` on top."""
    from agent_gym.trainers.config import ConfigError

    error = ConfigError
    values: dict[str, Any] = {}
    if path is not None:
        import yaml

        path = Path(path)
        if not path.is_file():
            raise error(f"config file {path} does not exist")
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as problem:
            raise error(f"{path} is not valid YAML: {problem}") from problem
        if not isinstance(loaded, dict):
            raise error(f"{path} must hold a mapping of field: value, got {type(loaded).__name__}")
        values.update(loaded)
    values.update(overrides or {})
    return config_from_dict(values, cls)


def add_dataclass_arguments(parser: argparse.ArgumentParser, cls: type, *, explicit_only: bool = True,
                            types: dict[str, Callable[[str], Any]] | None = None) -> None:
    """One flag per field of ``cls`` (``--field-name``), its help from the field's metadata.

    ``types`` maps a field name to the converter of its flag's text where that converter belongs to the CLI
    (``port_number``, whose ``argparse.ArgumentTypeError`` names the problem), overriding metadata ``type``.
    """
    types = types or {}
    hints = typing.get_type_hints(cls)
    groups: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        inner, optional = _strip_optional(hints[f.name])
        default = field_default(f)
        help_text = f.metadata.get("help", "")
        if explicit_only:  # the flag's own default is "not given": say what that means
            help_text = f"{help_text} [default: {default!r}]"
        help_text = help_text.replace("%", "%%")
        kwargs: dict[str, Any] = {"dest": f.name, "help": help_text,
                                  "default": argparse.SUPPRESS if explicit_only else default}
        if "metavar" in f.metadata:
            kwargs["metavar"] = f.metadata["metavar"]
        target: Any = parser
        converter = types.get(f.name, f.metadata.get("type"))
        if f.metadata.get("positional"):
            kwargs.pop("dest")
            kwargs.pop("default")
            if converter is not None:
                kwargs["type"] = converter
            if f.metadata.get("choices"):
                kwargs["choices"] = list(f.metadata["choices"])
            if typing.get_origin(inner) is list:  # one or more values, e.g. `plot RUN_DIR...`
                kwargs["nargs"] = "+"
            parser.add_argument(f.name, **kwargs)
            continue
        if "exclusive" in f.metadata:
            if f.metadata["exclusive"] not in groups:
                groups[f.metadata["exclusive"]] = parser.add_mutually_exclusive_group()
            target = groups[f.metadata["exclusive"]]
        if "one_of" in f.metadata:
            if f.metadata["one_of"] not in groups:
                groups[f.metadata["one_of"]] = parser.add_mutually_exclusive_group(required=True)
            target = groups[f.metadata["one_of"]]
        elif f.metadata.get("required"):
            kwargs["required"] = True
        # earlier flag names that still work: renamed fields', and a field's own "aliases"
        old_flags = [f"--{old.replace('_', '-')}" for old, new in RENAMED_FIELDS.items() if new == f.name]
        old_flags += list(f.metadata.get("aliases", ()))
        if f.metadata.get("append"):  # repeatable: each flag adds one item (its converter's result)
            if not explicit_only:
                kwargs["default"] = []  # argparse appends to the default: a fresh list per parser
            target.add_argument(flag, *old_flags, action="append", type=converter, **kwargs)
        elif converter is not None:
            target.add_argument(flag, *old_flags, type=converter, **kwargs)
        elif inner is bool:
            if not explicit_only and default is False:  # a switch: --help shows no "(default: False)"
                target.add_argument(flag, *old_flags, action="store_true", **kwargs)
            else:
                target.add_argument(flag, *old_flags, action=argparse.BooleanOptionalAction, **kwargs)
        elif typing.get_origin(inner) is Literal or f.metadata.get("choices"):
            choices = f.metadata.get("choices") or typing.get_args(inner)
            target.add_argument(flag, *old_flags, choices=list(choices), **kwargs)
        elif typing.get_origin(inner) is list:
            item = (typing.get_args(inner) or (str,))[0]
            target.add_argument(flag, *old_flags, nargs="+", metavar="N" if item is int else "NAME", **kwargs)
        elif typing.get_origin(inner) is dict:
            target.add_argument(flag, *old_flags, metavar="JSON", **kwargs)
        elif optional and explicit_only:
            kwargs.setdefault("metavar", getattr(inner, "__name__", "VALUE").upper() + "|none")
            target.add_argument(flag, *old_flags, **kwargs)
        else:
            target.add_argument(flag, *old_flags, type=inner, **kwargs)


def config_from_namespace(ns: argparse.Namespace, cls: type) -> Any:
    """A ``cls`` from parsed flags: the YAML of ``ns.config`` (if any) with the flags on top."""
    names = {f.name for f in dataclasses.fields(cls)}
    overrides = {key: value for key, value in vars(ns).items() if key in names}
    return load_config(getattr(ns, "config", None), overrides, cls)
