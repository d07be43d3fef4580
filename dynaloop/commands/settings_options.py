"""Command-line options made from a settings model, so that a setting is written once: its
type, default and checks in the pydantic model (the API's body), its option's help beside it
(``rounds.build.build_settings.Flag``), and here only the way from one to the other.

:func:`options_from` turns one parameter of a command, annotated with the model, into one
option per field of the model (``--dev-test-min-votes`` for ``dev_test_min_votes``), and
hands the command the model built from them, checked as the API checks a body.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar

import typer
from pydantic import BaseModel, ValidationError

from dynaloop.commands.common import fail, problems
from rounds.build.build_settings import Flag

Command = TypeVar("Command", bound=Callable[..., Any])


def _option_type(annotation: Any, flag: Flag) -> Any:
    """The type the command line reads: a choice of words (``Literal``) is read as text and
    checked by the model; a setting with a word for null is read as text."""
    args = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, type(int | None)) else ()
    members = [a for a in args if a is not type(None)] or [annotation]
    nullable = len(members) < len(args)
    base = members[0]
    if len(members) > 1 or typing.get_origin(base) is Literal:
        base = str
    if flag.null is not None:
        return str
    return base | None if nullable else base


def options_from(model: type[BaseModel], parameter: str, what: str) -> Callable[[Command], Command]:
    """Replace the command's ``parameter`` (annotated with ``model``) by one option per field
    of ``model``, in the model's order, with the field's :class:`Flag` help and its default; the
    command receives ``model`` built from them (an invalid value ends the command with the
    model's problems, as the API answers 422; ``what`` names the settings in that message). The
    command declares ``parameter`` keyword-only, where its options are to appear."""
    fields = model.model_fields

    def flag_of(name: str) -> Flag:
        flags = [m for m in fields[name].metadata if isinstance(m, Flag)]
        if len(flags) != 1:
            raise TypeError(f"{model.__name__}.{name} needs one Flag(help=...) to be a command-line option")
        return flags[0]

    def decorate(command: Command) -> Command:
        hints = typing.get_type_hints(command, include_extras=True)
        original = inspect.signature(command)
        options = []
        for name, info in fields.items():
            flag = flag_of(name)
            default = info.default if info.default is not None or flag.null is None else flag.null
            options.append(
                inspect.Parameter(
                    name,
                    inspect.Parameter.KEYWORD_ONLY,
                    annotation=Annotated[_option_type(info.annotation, flag), typer.Option(help=flag.help)],
                    default=default,
                )
            )
        parameters = []
        for param in original.parameters.values():
            if param.name == parameter:
                parameters += options
            else:
                parameters.append(param.replace(annotation=hints.get(param.name, param.annotation)))

        @functools.wraps(command)
        def run(**kwargs: Any) -> Any:
            given = {name: kwargs.pop(name) for name in fields}
            for name, value in given.items():
                if flag_of(name).null is not None and value == flag_of(name).null:
                    given[name] = None
            try:
                kwargs[parameter] = model.model_validate(given)
            except ValidationError as exc:
                raise fail(f"invalid {what}: {problems(exc)}") from exc
            return command(**kwargs)

        signature = original.replace(parameters=parameters)
        run.__signature__ = signature  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()}
        return typing.cast(Command, run)

    return decorate
