"""Command-line arguments that several commands share, and the error that reports what a user typed wrong.

A command raises :class:`UsageError` for a mistake in its arguments (an unknown env id or policy, an env
keyword the env refuses, a task id it does not have); ``agent-gym`` prints it as one line,
``agent-gym <command>: <message>``, and exits with status 2, argparse's status for usage errors. The library
itself raises ``agent_gym.error.AgentGymError``s, never this: only the commands in ``agent_gym.cli`` do.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

__all__ = [
    "DefaultsHelpFormatter",
    "UsageError",
    "add_env_kwargs_arguments",
    "env_kwargs_from_args",
    "cli_make_env",
    "one_line",
    "parse_env_kwarg_pairs",
    "parse_json_object",
    "port_number",
    "user_errors",
]


class UsageError(SystemExit):
    """A mistake in a command's arguments; the message says what is wrong and what to do instead.

    A ``SystemExit``, so a command function called outside ``main`` also stops with the message and no
    traceback.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """``--help`` that shows each option's default, except where there is none to show (required, unset, off)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        help_ = action.help or ""
        # identity checks: a default of 0 is shown (0 == False)
        unset = action.default is None or action.default is False or action.default is argparse.SUPPRESS
        shown = not unset and action.default != [] and not action.required
        if shown and "%(default)" not in help_ and action.option_strings:
            help_ += " (default: %(default)s)"
        return help_


def one_line(error: BaseException | str) -> str:
    """An error's message on one line (some messages spread a path or a hint over several)."""
    text = " ".join(str(error).split())
    # KeyError's str() is the repr of its argument: drop the quotes it adds around a message.
    if isinstance(error, KeyError) and len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]
    return text


@contextmanager
def user_errors(*types: type[BaseException], context: str = "") -> Iterator[None]:
    """Turn the given exception types, raised inside the block, into a :class:`UsageError`."""
    try:
        yield
    except types as error:
        raise UsageError(f"{context}{one_line(error)}") from error


def port_number(text: str) -> int:
    """argparse type of ``--port``: a TCP port, 0 (any free port) to 65535.

    The socket layer would take 99999 and listen on 99999 mod 65536 = 34463, which no client would look for.
    """
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a port is a number from 0 to 65535, got {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is a number from 0 to 65535, got {port}")
    return port


def _parse_value(text: str) -> Any:
    """``hops=3``: JSON values when they parse (numbers, lists, booleans), else the string itself."""
    try:
        return json.loads(text)
    except ValueError:  # JSONDecodeError, and numbers Python refuses to convert
        return text


def parse_env_kwarg_pairs(pairs: Sequence[str] | None) -> dict[str, Any]:
    """Turn repeated ``KEY=VALUE`` options into keyword arguments for ``gym.make``."""
    kwargs: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--env-kwarg expects key=value, got {pair!r}")
        kwargs[key.strip()] = _parse_value(value)
    return kwargs


def add_env_kwargs_arguments(parser: argparse.ArgumentParser, *, json_flag: bool = True) -> None:
    """``--env-kwarg KEY=VALUE`` (repeatable) and, unless the command defines its own, ``--env-kwargs JSON``."""
    parser.add_argument("--env-kwarg", action="append", metavar="KEY=VALUE", default=[],
                        help="keyword argument for the env (repeatable), e.g. --env-kwarg hops=3; "
                             "overrides the same key in --env-kwargs")
    if json_flag:
        parser.add_argument("--env-kwargs", default=None, metavar="JSON",
                            help="keyword arguments for the env as one JSON object, e.g. '{\"hops\": 3}'")


def parse_json_object(text: str | dict[str, Any] | None, flag: str = "--env-kwargs") -> dict[str, Any]:
    if text is None or isinstance(text, dict):
        return dict(text or {})
    try:
        value = json.loads(text)
    except ValueError as error:
        raise UsageError(f"{flag} is not valid JSON ({error}); pass an object such as '{{\"hops\": 3}}'") from error
    if not isinstance(value, dict):
        raise UsageError(f"{flag} expects a JSON object such as '{{\"hops\": 3}}', got {text!r}")
    return value


def env_kwargs_from_args(namespace: argparse.Namespace) -> dict[str, Any]:
    """The env keyword arguments of a command: ``--env-kwargs`` first, each ``--env-kwarg`` on top."""
    kwargs = parse_json_object(getattr(namespace, "env_kwargs", None))
    kwargs.update(parse_env_kwarg_pairs(getattr(namespace, "env_kwarg", None)))
    return kwargs


def cli_make_env(env_id: str, env_kwargs: dict[str, Any] | None = None) -> Any:
    """``agent_gym.make_env(env_id, **env_kwargs)`` for a command: an unknown id or a refused keyword becomes a
    `UsageError` (one line, exit status 2) instead of the library's `EnvMakeError` or the env's own error."""
    from agent_gym.error import AgentGymError
    from agent_gym.make import EnvMakeError
    from agent_gym.make import make_env as make

    env_kwargs = env_kwargs or {}
    try:
        return make(env_id, env_kwargs)
    except EnvMakeError as error:  # its message already says where the ids are listed
        raise UsageError(one_line(error)) from error
    except (AgentGymError, TypeError, ValueError, KeyError, FileNotFoundError) as error:
        settings = " ".join(f"{key}={value!r}" for key, value in env_kwargs.items())
        raise UsageError(f"cannot make {env_id}{' with ' + settings if settings else ''}: "
                         f"{one_line(error)}") from error
