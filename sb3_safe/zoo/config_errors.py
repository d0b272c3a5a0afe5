"""
A configuration's values checked against what the algorithm takes, and the errors rl_zoo3's setup raises for a bad
configuration (an unexpected keyword, a bad value, a class path that does not import) explained in one line.
"""

import ast
import contextlib
import inspect
import numbers
import re
import types
import typing
from collections.abc import Iterator
from typing import Any

import numpy as np
from rl_zoo3 import ALGOS

from sb3_safe.zoo.errors import ZooUsageError, did_you_mean, one_line

#: What rl_zoo3's setup raises for a bad configuration: the constructors of the wrappers, callbacks, environments
#: and the model check their arguments (ValueError, TypeError, SB3's asserts), class paths may not import
#: (ImportError, AttributeError), keys may be missing (KeyError, IndexError). Others (RuntimeError, OSError,
#: MemoryError ...) are not taken for configuration errors.
SETUP_ERRORS = (ValueError, TypeError, KeyError, IndexError, AttributeError, ImportError, AssertionError)

# CPython's message when a constructor gets a keyword it does not take
_UNEXPECTED_KEYWORD = re.compile(r"(\w+)\.__init__\(\) got an unexpected keyword argument '(\w+)'")
# sb3-safe's message for a value outside a fixed set of choices
_NOT_ONE_OF = re.compile(r"must be one of (\(.*?\)), got '([^']*)'")
# A number that YAML 1.1 (PyYAML) reads as a string: an exponent without a decimal point
_YAML_STRING_NUMBER = re.compile(r"[-+]?[0-9]+[eE][-+]?[0-9]+")


def _fits(value: Any, annotation: Any) -> bool | None:
    """Whether a value fits a parameter's annotation; None where this simple check cannot tell."""
    if annotation is Any:
        return True
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        fits = [_fits(value, member) for member in typing.get_args(annotation)]
        return True if True in fits else (False if all(fit is False for fit in fits) else None)
    if origin is typing.Literal:
        return value in typing.get_args(annotation)
    if origin is tuple:
        return isinstance(value, tuple | list)  # YAML has no tuples
    if isinstance(origin, type):
        return isinstance(value, origin)  # dict[...], type[...], Callable[...]
    if annotation is float:
        return isinstance(value, numbers.Real)
    if annotation is int:
        return isinstance(value, numbers.Integral)
    if annotation is bool:
        return isinstance(value, bool | np.bool_ | numbers.Integral)
    if annotation is type(None):
        return value is None
    if isinstance(annotation, type) and annotation is not inspect.Parameter.empty:
        return isinstance(value, annotation)
    return None


def check_hyperparam_types(algo: str, hyperparams: dict[str, Any]) -> None:
    """
    Check the algorithm's keyword arguments against the annotations of its constructor, where these are simple
    (numbers, bools, strings, classes, dicts, tuples, choices, callables), so that a value of the wrong type
    (``n_epochs: twenty``) fails before training rather than during it.

    :param algo: the zoo algorithm name
    :param hyperparams: the keyword arguments rl_zoo3 passes, after its conversions (schedules, policy_kwargs)
    :raises ZooUsageError: naming the key, its value and what the algorithm takes
    """
    algo_class = ALGOS[algo]
    parameters = inspect.signature(algo_class).parameters
    for key, value in hyperparams.items():
        if key not in parameters or _fits(value, parameters[key].annotation) is not False:
            continue
        hint = ""
        if isinstance(value, str) and _YAML_STRING_NUMBER.fullmatch(value):
            hint = f"; YAML reads {value} as a string: write {float(value)!r}"
        takes = inspect.formatannotation(parameters[key].annotation)
        raise ZooUsageError(
            f"config value {key}: {value!r} is a {type(value).__name__}, but {algo} ({algo_class.__name__}) "
            f"takes {key}: {takes}{hint}"
        )


def explain_unexpected_keyword(error: TypeError, algo: str) -> str | None:
    """
    One line for a configuration key that a constructor rejected, with the closest keys the algorithm accepts.

    :param error: the error the constructor raised
    :param algo: the zoo algorithm name
    :return: the explanation, or None if ``error`` is not about an unexpected keyword argument
    """
    match = _UNEXPECTED_KEYWORD.search(str(error))
    if match is None:
        return None
    owner, key = match.groups()
    algo_class = ALGOS[algo]
    if owner != algo_class.__name__:
        return f"{owner} does not accept the keyword {key!r} (from policy_kwargs, env_kwargs or a callback or wrapper)"
    accepted = [name for name in inspect.signature(algo_class).parameters if name != "env" and not name.startswith("_")]
    hint = did_you_mean(key, accepted) or f"; it takes: {', '.join(accepted)}"
    return f"algorithm {algo} ({algo_class.__name__}) does not accept the config key {key!r}{hint}"


def _close_match_hint(error: Exception, message: str) -> str:
    # A misspelled attribute (a class path's name) or choice
    if isinstance(error, AttributeError) and error.name is not None and error.obj is not None:
        return did_you_mean(error.name, [name for name in dir(error.obj) if not name.startswith("_")])
    match = _NOT_ONE_OF.search(message)
    if match is None:
        return ""
    try:
        choices = ast.literal_eval(match.group(1))
    except (ValueError, SyntaxError):
        return ""
    return did_you_mean(match.group(2), map(str, choices))


def explain_config_error(error: Exception, algo: str) -> str:
    """
    One line for an error that rl_zoo3 raised while it read the configuration and built the callbacks,
    wrappers, environments and the model from it.

    :param error: the error
    :param algo: the zoo algorithm name
    :return: the explanation, with the close matches of a misspelled key, choice or class name
    """
    if isinstance(error, TypeError) and (explanation := explain_unexpected_keyword(error, algo)) is not None:
        return explanation
    message = one_line(str(error))
    if not isinstance(error, ValueError):
        # The type says what a KeyError's "'n_timesteps'" or an empty AssertionError means
        message = f"{type(error).__name__}: {message}" if message else type(error).__name__
    return f"bad configuration for {algo}: {message}{_close_match_hint(error, message)}"


@contextlib.contextmanager
def explained_config_errors(algo: str) -> Iterator[None]:
    """
    Turn a constructor's unexpected keyword raised inside the block into :class:`ZooUsageError`: ``-optimize``
    builds each trial's model after the setup, so a key the algorithm rejects fails there.

    :param algo: the zoo algorithm name
    """
    try:
        yield
    except TypeError as error:
        explanation = explain_unexpected_keyword(error, algo)
        if explanation is None:
            raise
        raise ZooUsageError(explanation) from error
