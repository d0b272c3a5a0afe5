"""
rl_zoo3's ``train()`` / ``enjoy()`` run as a command with sb3-safe's checks: the options sb3-safe reads (parsed as
rl_zoo3 parses them), an experiment manager whose setup reports a bad configuration in one line, and the context in
which rl_zoo3's parsers and ``train()`` pick both up.
"""

import argparse
import contextlib
import importlib
import io
import shutil
import signal
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TextIO

import rl_zoo3.enjoy
import rl_zoo3.train
from rl_zoo3.exp_manager import ExperimentManager
from rl_zoo3.utils import StoreDict
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback

from sb3_safe.loading import RefusedFileError
from sb3_safe.zoo.checks import LOG_FOLDER, MissingSavedModel, check_algo, check_env, find_saved_model
from sb3_safe.zoo.config_errors import (
    SETUP_ERRORS,
    check_evaluated_syntax,
    check_hyperparam_ranges,
    check_hyperparam_types,
    explain_config_error,
)
from sb3_safe.zoo.errors import TrainingInterrupted, ZooUsageError, one_line
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
    parser.add_argument("-n", "--n-timesteps", type=int)
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
    # rl_zoo3 takes -n <= 0 for "not given": train would silently train the configuration's budget
    if options.n_timesteps is not None and options.n_timesteps <= 0:
        what = "train" if command == "train" else "run the agent"
        raise ZooUsageError(f"-n {options.n_timesteps}: the number of timesteps to {what} must be > 0")
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


class _HeldOutput:
    """Standard output held back until :meth:`release`: shown if the command starts, dropped if its input is bad."""

    def __init__(self) -> None:
        self.held = io.StringIO()
        self.target: TextIO | None = None

    def hold(self) -> None:
        self.target, sys.stdout = sys.stdout, self.held

    def release(self) -> None:
        """Show what was held, and what follows as it is written."""
        if self.target is not None:
            sys.stdout = self.target
            self.target = None
            sys.stdout.write(self.held.getvalue())
            sys.stdout.flush()

    def drop(self) -> None:
        if self.target is not None:
            sys.stdout = self.target
            self.target = None


@dataclass
class ZooRun:
    """
    What :func:`rl_zoo3_command` tells of the command it ran.

    :param output: its standard output, held until the experiment's setup succeeded (``train``)
    :param interruption: the Ctrl-C that stopped training, after rl_zoo3 saved the model; None if there was none
    """

    output: _HeldOutput = field(default_factory=_HeldOutput)
    interruption: TrainingInterrupted | None = None


class _CheckedExperimentManager(ExperimentManager):
    """
    rl_zoo3's experiment manager, whose setup (reading the configuration, building the environments and the
    model) reports a bad configuration as :class:`ZooUsageError`, before any training and before any of the setup's
    output. Errors of training and of the hyperparameter search stay as they are; a Ctrl-C during training is
    noted in :attr:`zoo_run` (rl_zoo3 then saves the model).
    """

    zoo_run: ZooRun

    def setup_experiment(self) -> tuple[BaseAlgorithm, dict[str, Any]] | None:
        new_run = not Path(self.save_path).exists()
        if self.trial_id == 0:
            # rl_zoo3 loads the trial only `if self.storage and self.study_name and self.trial_id`: trial 0 would
            # silently train the configuration's values
            self.trial_id = _TrialNumber(0)
        try:
            result = super().setup_experiment()
        except SETUP_ERRORS as error:
            if new_run:
                # rl_zoo3 creates the run folder before the model: enjoy would take the empty one for the latest run
                shutil.rmtree(self.save_path, ignore_errors=True)
            if isinstance(error, ZooUsageError | RefusedFileError):
                raise
            raise ZooUsageError(explain_config_error(error, self.algo)) from error
        self.zoo_run.output.release()
        return result

    def _preprocess_hyperparams(
        self, hyperparams: dict[str, Any]
    ) -> tuple[dict[str, Any], Callable | None, list[BaseCallback], Callable | None]:
        if "n_timesteps" not in hyperparams:
            # rl_zoo3 deletes the key, also with -n
            raise ZooUsageError(f"the configuration for {self.env_name.gym_id} has no n_timesteps (rl_zoo3 needs it)")
        # The configuration's n_timesteps counts only without -n
        check_hyperparam_ranges({k: v for k, v in hyperparams.items() if k != "n_timesteps" or self.n_timesteps <= 0})
        check_evaluated_syntax(hyperparams)
        processed = super()._preprocess_hyperparams(hyperparams)
        check_hyperparam_types(self.algo, processed[0])
        return processed

    def learn(self, model: BaseAlgorithm) -> None:
        interrupted = False

        def interrupt(signum: int, frame: types.FrameType | None) -> None:
            nonlocal interrupted
            interrupted = True
            raise KeyboardInterrupt

        # rl_zoo3 takes a KeyboardInterrupt for the end of training and saves the model: noted here (SIGINT's own
        # handler, so that nothing is added to the model, which pickles its attributes), so that the run is not
        # presented as finished
        previous = signal.signal(signal.SIGINT, interrupt)
        try:
            super().learn(model)
        finally:
            signal.signal(signal.SIGINT, previous)
        if interrupted:
            model_path = Path(self.save_path, f"{self.env_name}.zip")
            self.zoo_run.interruption = TrainingInterrupted(model.num_timesteps, self.n_timesteps, model_path)


def _raise_usage_error(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    raise ZooUsageError(message)


@contextlib.contextmanager
def rl_zoo3_command(prog: str, args: Sequence[str], hold_output: bool = False) -> Iterator[ZooRun]:
    """
    Run rl_zoo3's ``train()`` or ``enjoy()`` inside this block as the command ``prog args``, with sb3-safe's checks.

    :param prog: the command's name, for rl_zoo3's messages
    :param args: its command-line arguments
    :param hold_output: hold standard output back until the experiment's setup succeeded (``train``): bad input is
        then only its one-line error, without the configuration rl_zoo3 prints first
    :return: what happened (``interruption``: a Ctrl-C during training)
    """
    run = ZooRun()
    saved_argv, saved_error, saved_manager = sys.argv, argparse.ArgumentParser.error, rl_zoo3.train.ExperimentManager
    saved_model_path = rl_zoo3.enjoy.get_model_path
    # They parse sys.argv, with parsers whose errors would print the usage too: one line instead
    sys.argv = [prog, *args]
    argparse.ArgumentParser.error = _raise_usage_error  # type: ignore[method-assign, assignment]

    # train() and enjoy() look these up in their modules when they run
    class CheckedExperimentManager(_CheckedExperimentManager):
        zoo_run = run

    rl_zoo3.train.ExperimentManager = CheckedExperimentManager  # type: ignore[misc]
    rl_zoo3.enjoy.get_model_path = find_saved_model
    if hold_output:
        run.output.hold()
    try:
        yield run
    except MissingSavedModel as error:
        run.output.drop()
        raise ZooUsageError(str(error)) from error.__cause__
    except (ZooUsageError, RefusedFileError):
        run.output.drop()
        raise
    finally:
        # An error of another kind (a crash) shows what led to it
        run.output.release()
        sys.argv = saved_argv
        argparse.ArgumentParser.error = saved_error  # type: ignore[method-assign]
        rl_zoo3.train.ExperimentManager = saved_manager  # type: ignore[misc]
        rl_zoo3.enjoy.get_model_path = saved_model_path


def print_zoo_help(command: str) -> None:
    """
    Print rl_zoo3's own help of ``train`` or ``enjoy`` (its options), running nothing else.

    :param command: ``"train"`` or ``"enjoy"``
    """
    register()  # the algorithm choices include sb3-safe's
    saved_argv = sys.argv
    sys.argv = [f"sb3-safe {command}", "--help"]
    try:
        # Its parser is built inside the function, which ends at parse_args with --help
        (rl_zoo3.train.train if command == "train" else rl_zoo3.enjoy.enjoy)()
    except SystemExit:
        pass
    finally:
        sys.argv = saved_argv
