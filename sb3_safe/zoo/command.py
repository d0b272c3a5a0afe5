"""
rl_zoo3's ``train()`` / ``enjoy()`` run as a command with sb3-safe's checks: the options sb3-safe reads (parsed as
rl_zoo3 parses them), an experiment manager whose setup reports a bad configuration in one line, and the context in
which rl_zoo3's parsers and ``train()`` pick both up.
"""

import argparse
import contextlib
import importlib
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import rl_zoo3.enjoy
import rl_zoo3.train
from rl_zoo3.exp_manager import ExperimentManager
from rl_zoo3.utils import StoreDict
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback

from sb3_safe.loading import RefusedFileError
from sb3_safe.zoo.checks import LOG_FOLDER, MissingSavedModel, check_algo, check_env, find_saved_model
from sb3_safe.zoo.config_errors import SETUP_ERRORS, check_hyperparam_types, explain_config_error
from sb3_safe.zoo.errors import ZooUsageError, one_line
from sb3_safe.zoo.registration import register


class _OptionParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ZooUsageError(message)


class _KeyValues(StoreDict):
    """rl_zoo3's ``key:value`` options (``--hyperparams``, ``--env-kwargs``), checked item by item."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        for item in values:
            key, colon, value = item.partition(":")
            if not (key and colon):
                hint = f"; did you mean {item.replace('=', ':', 1)}?" if "=" in item else ""
                raise ZooUsageError(f"{option_string} takes key:value items, got {item!r}{hint}")
            try:
                # rl_zoo3 evaluates the value as Python
                super().__call__(parser, namespace, [item], option_string)
            except Exception as error:  # anything the expression raises
                quotes = "; a string needs quotes: key:\"'text'\"" if isinstance(error, NameError) else ""
                reason = f"{type(error).__name__}: {one_line(str(error))}"
                raise ZooUsageError(f"{option_string} {item}: cannot evaluate {value!r} ({reason}){quotes}") from error


def _zoo_options(command: str, zoo_args: Sequence[str]) -> argparse.Namespace:
    # Only the options sb3-safe checks, named and defaulted as rl_zoo3's; rl_zoo3 parses all of them itself
    parser = _OptionParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--algo", default="ppo")
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--gym-packages", nargs="+", default=[])
    parser.add_argument("--env-kwargs", nargs="+", action=_KeyValues)
    if command == "train":
        parser.add_argument("-f", "--log-folder", dest="folder", default=LOG_FOLDER)
        parser.add_argument("-conf", "--conf-file")
        parser.add_argument("-params", "--hyperparams", nargs="+", action=_KeyValues)
        parser.add_argument("--eval-env-kwargs", nargs="+", action=_KeyValues)
        parser.add_argument("-i", "--trained-agent", default="")
        parser.add_argument("-optimize", "--optimize-hyperparameters", dest="optimize", action="store_true")
        parser.add_argument("--storage")
        parser.add_argument("--study-name")
        parser.add_argument("--trial-id", type=int)
    return parser.parse_known_args(list(zoo_args))[0]


def checked_options(command: str, zoo_args: Sequence[str]) -> argparse.Namespace:
    """
    Register sb3-safe's algorithms, then read and check the options of ``train`` or ``enjoy`` that sb3-safe uses.

    :param command: ``"train"`` or ``"enjoy"``
    :param zoo_args: rl_zoo3's command-line arguments
    :return: those options, with rl_zoo3's names and defaults
    :raises ZooUsageError: a bad option, a ``--gym-packages`` module that does not import, an unknown algorithm
        or environment
    """
    register()
    options = _zoo_options(command, zoo_args)
    # rl_zoo3 imports them only after checking the id; environments they register must pass our check too
    for module in options.gym_packages:
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise ZooUsageError(f"--gym-packages {module}: {one_line(str(error))}") from error
    check_algo(options.algo)
    check_env(options.env)
    return options


class _TrialNumber(int):
    """A trial number that is true also for trial 0."""

    def __bool__(self) -> bool:
        return True


class _CheckedExperimentManager(ExperimentManager):
    """
    rl_zoo3's experiment manager, whose setup (reading the configuration, building the environments and the
    model) reports a bad configuration as :class:`ZooUsageError`, before any training. Errors of training and
    of the hyperparameter search stay as they are.
    """

    def setup_experiment(self) -> tuple[BaseAlgorithm, dict[str, Any]] | None:
        new_run = not Path(self.save_path).exists()
        if self.trial_id == 0:
            # rl_zoo3 loads the trial only `if self.storage and self.study_name and self.trial_id`: trial 0 would
            # silently train the configuration's values
            self.trial_id = _TrialNumber(0)
        try:
            return super().setup_experiment()
        except SETUP_ERRORS as error:
            if new_run:
                # rl_zoo3 creates the run folder before the model: enjoy would take the empty one for the latest run
                shutil.rmtree(self.save_path, ignore_errors=True)
            if isinstance(error, ZooUsageError | RefusedFileError):
                raise
            raise ZooUsageError(explain_config_error(error, self.algo)) from error

    def _preprocess_hyperparams(
        self, hyperparams: dict[str, Any]
    ) -> tuple[dict[str, Any], Callable | None, list[BaseCallback], Callable | None]:
        if "n_timesteps" not in hyperparams:
            # rl_zoo3 deletes the key, also with -n
            raise ZooUsageError(f"the configuration for {self.env_name.gym_id} has no n_timesteps (rl_zoo3 needs it)")
        processed = super()._preprocess_hyperparams(hyperparams)
        check_hyperparam_types(self.algo, processed[0])
        return processed


def _raise_usage_error(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    raise ZooUsageError(message)


@contextlib.contextmanager
def rl_zoo3_command(prog: str, args: Sequence[str]) -> Iterator[None]:
    """
    Run rl_zoo3's ``train()`` or ``enjoy()`` inside this block as the command ``prog args``, with sb3-safe's checks.

    :param prog: the command's name, for rl_zoo3's messages
    :param args: its command-line arguments
    """
    saved_argv, saved_error, saved_manager = sys.argv, argparse.ArgumentParser.error, rl_zoo3.train.ExperimentManager
    saved_model_path = rl_zoo3.enjoy.get_model_path
    # They parse sys.argv, with parsers whose errors would print the usage too: one line instead
    sys.argv = [prog, *args]
    argparse.ArgumentParser.error = _raise_usage_error  # type: ignore[method-assign, assignment]
    # train() and enjoy() look these up in their modules when they run
    rl_zoo3.train.ExperimentManager = _CheckedExperimentManager  # type: ignore[misc]
    rl_zoo3.enjoy.get_model_path = find_saved_model
    try:
        yield
    except MissingSavedModel as error:
        raise ZooUsageError(str(error)) from error.__cause__
    finally:
        sys.argv = saved_argv
        argparse.ArgumentParser.error = saved_error  # type: ignore[method-assign]
        rl_zoo3.train.ExperimentManager = saved_manager  # type: ignore[misc]
        rl_zoo3.enjoy.get_model_path = saved_model_path
