"""
A configuration's values checked against what the algorithm takes, and the errors rl_zoo3's setup raises for a bad
configuration (an unexpected keyword, a bad value, a class path that does not import) explained in one line.
"""

import ast
import contextlib
import inspect
import math
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

#: The hyperparameters' ranges (low, high, low included, high included), checked where the value is a number: the
#: meaning these names have in every SB3 / sb3-contrib / sb3-safe algorithm
RANGES: dict[str, tuple[float, float, bool, bool]] = {
    "gamma": (0.0, 1.0, False, True),
    "gae_lambda": (0.0, 1.0, True, True),
    "tau": (0.0, 1.0, False, True),
    "learning_rate": (0.0, math.inf, False, False),
    "clip_range": (0.0, math.inf, False, False),
    "clip_range_vf": (0.0, math.inf, False, False),
    "target_kl": (0.0, math.inf, False, False),
    "max_grad_norm": (0.0, math.inf, False, False),
    "ent_coef": (0.0, math.inf, True, False),
    "vf_coef": (0.0, math.inf, True, False),
    "n_steps": (0.0, math.inf, False, False),
    "batch_size": (0.0, math.inf, False, False),
    "n_epochs": (0.0, math.inf, False, False),
    "buffer_size": (0.0, math.inf, False, False),
    "learning_starts": (0.0, math.inf, True, False),
    "n_envs": (0.0, math.inf, False, False),
    "n_timesteps": (0.0, math.inf, False, False),
}
#: Configuration values that rl_zoo3 evaluates as Python
EVALUATED_KEYS = ("policy_kwargs", "replay_buffer_class", "replay_buffer_kwargs", "monitor_kwargs")

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


def _range_text(low: float, high: float, low_in: bool, high_in: bool) -> str:
    if high == math.inf:
        return f"values {'>=' if low_in else '>'} {low:g}"
    return f"values in {'[' if low_in else '('}{low:g}, {high:g}{']' if high_in else ')'}"


def check_hyperparam_ranges(hyperparams: dict[str, Any]) -> None:
    """
    Check the values of the hyperparameters in :data:`RANGES` that are numbers (a schedule or ``"auto"`` is left to
    the algorithm), so that ``gamma: 1.5`` or ``n_steps: 0`` fails before training rather than training nonsense.

    :param hyperparams: the configuration's values, as read (before rl_zoo3's conversions)
    :raises ZooUsageError: naming the key, its value and the range it takes
    """
    for key, (low, high, low_in, high_in) in RANGES.items():
        value = hyperparams.get(key)
        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            continue
        number = float(value)
        above = number > low or (low_in and number == low)
        below = number < high or (high_in and number == high)
        if not (above and below):  # also NaN
            allowed = _range_text(low, high, low_in, high_in)
            raise ZooUsageError(f"config value {key}: {value!r} is out of range; {key} takes {allowed}")


def check_evaluated_syntax(hyperparams: dict[str, Any]) -> None:
    """
    Check that the configuration's strings that rl_zoo3 evaluates as Python (``policy_kwargs`` ...) parse.

    :param hyperparams: the configuration's values, as read
    :raises ZooUsageError: naming the key and the syntax error
    """
    for key in EVALUATED_KEYS:
        value = hyperparams.get(key)
        if not isinstance(value, str):
            continue
        try:
            compile(value, key, "eval")
        except SyntaxError as error:
            raise ZooUsageError(f"config value {key}: {value!r} is not a Python expression ({error.msg})") from None


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
