"""
sb3-safe in rl-baselines3-zoo: :class:`~sb3_safe.KLAdaptivePPO` and :class:`~sb3_safe.SafeA2C` as the zoo
algorithms ``kl_ppo`` and ``safe_a2c``, their optuna samplers, the packaged zoo-format configurations, and
rl_zoo3's own ``train`` / ``enjoy`` run with them registered.

Needs the ``zoo`` extra (rl_zoo3, optuna, matplotlib): ``pip install "sb3-safe[zoo]"``.
"""

import argparse
import ast
import contextlib
import difflib
import importlib
import inspect
import io
import numbers
import re
import shutil
import sys
import time
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import gymnasium as gym
import matplotlib.pyplot as plt
import numpy as np
import optuna
import rl_zoo3.train
import yaml
from huggingface_sb3 import EnvironmentName
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from rl_zoo3 import ALGOS, create_test_env, get_saved_hyperparams
from rl_zoo3.enjoy import enjoy as zoo_enjoy
from rl_zoo3.exp_manager import ExperimentManager
from rl_zoo3.hyperparams_opt import (
    HYPERPARAMS_CONVERTER,
    HYPERPARAMS_SAMPLER,
    convert_onpolicy_params,
    sample_a2c_params,
    sample_ppo_params,
)
from rl_zoo3.utils import StoreDict, get_model_path
from sqlalchemy import exc as sqlalchemy_exc
from sqlalchemy.engine import make_url
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.monitor import load_results
from stable_baselines3.common.results_plotter import X_TIMESTEPS, ts2xy

from sb3_safe.a2c_safe import SafeA2C
from sb3_safe.ppo_kl import KLAdaptivePPO

#: sb3-safe's algorithms under their zoo names
ZOO_ALGOS: dict[str, type[BaseAlgorithm]] = {"kl_ppo": KLAdaptivePPO, "safe_a2c": SafeA2C}
#: Stock zoo algorithms that also train with their packaged configuration without ``--conf-file``: RecurrentPPO
#: with sb3-safe's recurrent policies (rl_zoo3's own ppo_lstm.yml names a policy RecurrentPPO lacks in "default")
PACKAGED_BY_DEFAULT = ("ppo_lstm",)
#: the packaged zoo configurations, one ``<algo>.yml`` per algorithm
CONFIG_DIR = Path(__file__).parent / "zoo_configs"
#: file name of the learning curve written into the run folder
LEARNING_CURVE = "learning_curve.png"
#: file name of the results of rl_zoo3's periodic evaluation (``--eval-freq`` > 0) in the run folder
EVALUATIONS = "evaluations.npz"
#: the learning curve's smoothing window, as a fraction of the run's timesteps
SMOOTHING_FRACTION = 0.05

#: Entries of a zoo configuration that are not environment ids: rl_zoo3 uses "atari" for the Atari ids without an
#: entry, "default" for the other ids without one
SPECIAL_ENTRIES = ("atari", "default")

# CPython's message when a constructor gets a keyword it does not take
_UNEXPECTED_KEYWORD = re.compile(r"(\w+)\.__init__\(\) got an unexpected keyword argument '(\w+)'")
# sb3-safe's message for a value outside a fixed set of choices
_NOT_ONE_OF = re.compile(r"must be one of (\(.*?\)), got '([^']*)'")
# difflib ratio from which a configuration key that is no registered id counts as a typo of the requested id:
# one- and two-letter typos of ids score 0.88 and more, keys of other environments mostly less
_TYPO_CUTOFF = 0.85
# A number that YAML 1.1 (PyYAML) reads as a string: an exponent without a decimal point
_YAML_STRING_NUMBER = re.compile(r"[-+]?[0-9]+[eE][-+]?[0-9]+")
# What rl_zoo3's setup raises for a bad configuration: the constructors of the wrappers, callbacks, environments
# and the model check their arguments (ValueError, TypeError, SB3's asserts), class paths may not import
# (ImportError, AttributeError), keys may be missing (KeyError, IndexError). Others (RuntimeError, OSError,
# MemoryError ...) are not taken for configuration errors.
_SETUP_ERRORS = (ValueError, TypeError, KeyError, IndexError, AttributeError, ImportError, AssertionError)


class ZooUsageError(ValueError):
    """Bad input to ``sb3-safe train`` / ``enjoy``; the message is one line that names the problem."""


@dataclass
class RunReport:
    """
    The result of a finished ``sb3-safe train`` run.

    :param model_path: the saved model
    :param learning_curve: the learning-curve PNG, or None if no training episode finished
    :param episode_returns: the return of each evaluation episode of the saved model
    :param deterministic: whether the evaluation used deterministic actions
    """

    model_path: Path
    learning_curve: Path | None
    episode_returns: list[float]
    deterministic: bool

    def summary(self) -> str:
        """Three lines: the model, the learning curve and the evaluation."""
        returns = self.episode_returns
        actions = "deterministic" if self.deterministic else "stochastic"
        return (
            f"saved model: {self.model_path}\n"
            f"learning curve: {self.learning_curve or 'none (no training episode finished)'}\n"
            f"evaluation over {len(returns)} episodes ({actions}): "
            f"mean return {np.mean(returns):.1f} +/- {np.std(returns):.1f}"
        )


def register() -> None:
    """Add ``kl_ppo`` and ``safe_a2c`` to rl_zoo3's algorithms, samplers and trial converters (idempotent)."""
    # rl_zoo3's train, enjoy and ExperimentManager all read these very dicts when they run
    ALGOS.update(ZOO_ALGOS)
    HYPERPARAMS_SAMPLER.update(kl_ppo=sample_kl_ppo_params, safe_a2c=sample_safe_a2c_params)
    HYPERPARAMS_CONVERTER.update(dict.fromkeys(ZOO_ALGOS, convert_safe_params))


def config_path(algo: str) -> Path:
    """
    The packaged zoo configuration of an algorithm.

    :param algo: ``kl_ppo``, ``safe_a2c``, ``ppo`` or ``a2c``
    :return: the path of ``zoo_configs/<algo>.yml`` inside the installed package
    """
    path = CONFIG_DIR / f"{algo}.yml"
    if not path.is_file():
        available = ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.yml")))
        raise ZooUsageError(f"no packaged configuration for {algo!r}; available: {available}")
    return path


# ----- optuna samplers -----


def _sample_policy_bounds(trial: optuna.Trial, n_actions: int) -> dict[str, float]:
    # rl_zoo3 passes n_actions > 0 only for Box action spaces: tune the log-std range there, the logit bound else
    if n_actions > 0:
        return {
            "log_std_min": trial.suggest_float("log_std_min", -20.0, -2.0),
            "log_std_max": trial.suggest_float("log_std_max", 0.0, 2.0),
        }
    return {"logit_bound": trial.suggest_float("logit_bound", 2.0, 20.0, log=True)}


def _move_policy_bounds(hyperparams: dict[str, Any]) -> dict[str, Any]:
    # The safe policies take the bounds as policy keywords
    hyperparams = dict(hyperparams)
    policy_kwargs = dict(hyperparams.get("policy_kwargs", {}))
    if "log_std_min" in hyperparams:
        policy_kwargs["log_std_range"] = (hyperparams.pop("log_std_min"), hyperparams.pop("log_std_max"))
    if "logit_bound" in hyperparams:
        policy_kwargs["logit_bound"] = hyperparams.pop("logit_bound")
    return {**hyperparams, "policy_kwargs": policy_kwargs}


def sample_kl_ppo_params(trial: optuna.Trial, n_actions: int, n_envs: int, additional_args: dict) -> dict[str, Any]:
    """
    Sampler for KLAdaptivePPO: rl_zoo3's PPO sampler, plus the KL target d_targ and the initial penalty
    coefficient, plus the policy's ``log_std_range`` (Box actions) or ``logit_bound`` (discrete actions).

    :param trial: the optuna trial
    :param n_actions: the action dimension for Box action spaces, else 0
    :param n_envs: the number of environments
    :param additional_args: rl_zoo3's extra sampler arguments
    :return: the algorithm's keyword arguments
    """
    hyperparams = sample_ppo_params(trial, n_actions, n_envs, additional_args)
    # The PPO paper (sec. 4) tries d_targ in {0.003, 0.01, 0.03}
    hyperparams["adaptive_kl_target"] = trial.suggest_float("adaptive_kl_target", 0.003, 0.03, log=True)
    hyperparams["initial_kl_beta"] = trial.suggest_float("initial_kl_beta", 0.1, 10.0, log=True)
    return _move_policy_bounds({**hyperparams, **_sample_policy_bounds(trial, n_actions)})


def sample_safe_a2c_params(trial: optuna.Trial, n_actions: int, n_envs: int, additional_args: dict) -> dict[str, Any]:
    """
    Sampler for SafeA2C: rl_zoo3's A2C sampler plus the policy's ``log_std_range`` (Box actions) or
    ``logit_bound`` (discrete actions).

    :param trial: the optuna trial
    :param n_actions: the action dimension for Box action spaces, else 0
    :param n_envs: the number of environments
    :param additional_args: rl_zoo3's extra sampler arguments
    :return: the algorithm's keyword arguments
    """
    hyperparams = sample_a2c_params(trial, n_actions, n_envs, additional_args)
    return _move_policy_bounds({**hyperparams, **_sample_policy_bounds(trial, n_actions)})


def convert_safe_params(sampled_params: dict[str, Any]) -> dict[str, Any]:
    """
    The keyword arguments of a finished trial of ``kl_ppo`` or ``safe_a2c``, from its raw ``trial.params``
    (what rl_zoo3 uses for ``--storage ... --study-name ... --trial-id N``).

    :param sampled_params: ``trial.params``
    :return: the algorithm's keyword arguments, as the sampler returned them
    """
    return _move_policy_bounds(convert_onpolicy_params(sampled_params))


# ----- input checks -----


def _close_matches(word: str, choices: Iterable[str]) -> list[str]:
    return difflib.get_close_matches(word, list(choices), n=3)


def check_algo(algo: str) -> None:
    """
    :param algo: a zoo algorithm name
    :raises ZooUsageError: naming the close matches, if rl_zoo3 (with sb3-safe's algorithms) does not know it
    """
    if algo not in ALGOS:
        hint = _did_you_mean(algo, ALGOS) or f"; choose from: {', '.join(ALGOS)}"
        raise ZooUsageError(f"unknown algorithm {algo!r}{hint}")


def check_env(env_id: str) -> None:
    """
    :param env_id: a gymnasium environment id
    :raises ZooUsageError: naming the close matches, if gymnasium's registry does not hold it
    """
    if env_id not in gym.registry:
        hint = _did_you_mean(env_id, gym.registry) or "; no close match in gymnasium's registry"
        raise ZooUsageError(f"unknown environment id {env_id!r}{hint}")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _did_you_mean(word: str, choices: Iterable[str]) -> str:
    matches = _close_matches(word, choices)
    return f"; did you mean: {', '.join(matches)}?" if matches else ""


def _file_hint(path: Path) -> str:
    # The files next to a missing one with close names
    siblings = [sibling.name for sibling in path.parent.iterdir()] if path.parent.is_dir() else []
    matches = _close_matches(path.name, siblings)
    return f"; did you mean: {', '.join(str(path.parent / match) for match in matches)}?" if matches else ""


def _yaml_error(error: yaml.YAMLError) -> str:
    # PyYAML's message takes several lines, with the file name on each
    if not isinstance(error, yaml.MarkedYAMLError) or error.problem_mark is None:
        return f": {_one_line(str(error))}"
    mark, context_mark = error.problem_mark, error.context_mark
    where = f" ({error.context} at line {context_mark.line + 1})" if error.context and context_mark else ""
    return f" at line {mark.line + 1}, column {mark.column + 1}: {_one_line(f'{error.problem}{where}')}"


def check_config_file(path: str, env_id: str) -> None:
    """
    Check a zoo configuration before rl_zoo3 reads it: the file, its YAML, and the entry rl_zoo3 will take for
    the environment: the environment's own, else ``atari`` (Atari ids) or ``default``. rl_zoo3 falls back on
    those silently, so a key that is no registered id and close to the requested one is taken for a typo.

    :param path: the ``--conf-file`` value: a ``.yml`` / ``.yaml`` / ``.py`` file, or else a module name
    :param env_id: the environment id
    :raises ZooUsageError: a missing file, a directory, a YAML syntax error, no entry for the environment, or a
        key that looks like a typo of its id
    """
    file = Path(path)
    if file.is_dir():
        raise ZooUsageError(f"--conf-file {path}: is a directory; pass a .yml file")
    if file.suffix not in (".yml", ".yaml", ".py"):
        return  # rl_zoo3 imports it as a module
    if not file.is_file():
        raise ZooUsageError(f"--conf-file {path}: no such file{_file_hint(file)}")
    if file.suffix == ".py":
        return
    try:
        config = yaml.safe_load(file.read_text())
    except yaml.YAMLError as error:
        raise ZooUsageError(f"--conf-file {path}: invalid YAML{_yaml_error(error)}") from error
    if not isinstance(config, dict):
        raise ZooUsageError(f"--conf-file {path}: expected environment ids mapped to hyperparameters")
    keys = [key for key in config if isinstance(key, str)]
    entry = env_id
    if env_id not in config:
        entry = "atari" if ExperimentManager.is_atari(env_id) else "default"
        unknown = [key for key in keys if key not in SPECIAL_ENTRIES and key not in gym.registry]
        typos = difflib.get_close_matches(env_id, unknown, n=3, cutoff=_TYPO_CUTOFF)
        if typos:
            instead = f"its {entry!r} entry" if entry in config else "no entry"
            raise ZooUsageError(
                f"{path} has no entry {env_id!r} but {', '.join(map(repr, typos))}, which is no registered "
                f"environment id: a typo of {env_id!r}? (rl_zoo3 would train with {instead})"
            )
        if entry not in config:
            hint = _did_you_mean(env_id, keys) or f"; its entries: {', '.join(keys[:8])}{', ...' if len(keys) > 8 else ''}"
            raise ZooUsageError(f"{path} has no entry {env_id!r} and no {entry!r} entry{hint}")
    if not isinstance(config[entry], dict):
        raise ZooUsageError(f"{path}: the entry {entry!r} must map hyperparameter names to values, got {config[entry]!r}")


def check_trained_agent(path: str) -> None:
    """
    :param path: the ``-i`` value, the saved model to continue training
    :raises ZooUsageError: if it is not a ``.zip`` file
    """
    file = Path(path)
    if file.is_dir():
        raise ZooUsageError(f"-i {path}: is a directory; pass the model's .zip")
    if not file.is_file():
        raise ZooUsageError(f"-i {path}: no such file{_file_hint(file)}")
    if file.suffix != ".zip":
        raise ZooUsageError(f"-i {path}: not a .zip; pass the model's .zip")


def _storage_label(storage: str) -> str:
    # A database URL may hold a password: messages show it masked
    try:
        url = make_url(storage)
    except sqlalchemy_exc.ArgumentError:
        return storage  # a journal file, or no URL at all
    return storage if url.password is None else url.render_as_string(hide_password=True)


def open_storage(storage: str, attempts: int = 5) -> optuna.storages.BaseStorage:
    """
    Open an optuna storage as rl_zoo3 opens it: a journal file for a ``.log`` path, else a database URL
    (``sqlite:///study.db``, ``postgresql://user:password@host:5432/db``). A database gets optuna's tables if it has
    none yet.

    :param storage: the ``--storage`` value
    :param attempts: how often to try creating the tables of a database while other workers create them too
    :return: the storage
    :raises ZooUsageError: for a URL that is no database URL, a database driver that is not installed, or a database
        that cannot be opened (refused connection, unknown database or user ...); the URL's password is masked
    """
    if storage.endswith(".log"):
        return JournalStorage(JournalFileBackend(storage))
    label = _storage_label(storage)
    attempt = 1
    while True:
        try:
            return optuna.storages.RDBStorage(storage)
        except ImportError as error:
            # optuna's message does not name the missing module, its cause does
            driver = _one_line(str(error.__cause__ or error))
            postgres = make_url(storage).drivername in ("postgresql", "postgresql+psycopg")
            extra = "; pip install 'sb3-safe[postgres]'" if postgres else ""
            raise ZooUsageError(f"--storage {label}: the database driver is not installed ({driver}){extra}") from error
        except sqlalchemy_exc.ArgumentError as error:
            raise ZooUsageError(f"--storage {label}: not a database URL ({_one_line(str(error))})") from error
        except sqlalchemy_exc.DBAPIError as error:
            # Workers started together on an empty database all create its tables: all but one fail, once
            if isinstance(error, sqlalchemy_exc.IntegrityError | sqlalchemy_exc.ProgrammingError) and attempt < attempts:
                time.sleep(0.2 * attempt)
                attempt += 1
                continue
            reason = _one_line(str(error.orig or error))
            raise ZooUsageError(f"--storage {label}: cannot open the database: {reason}") from error


def check_trial(storage: str | None, study_name: str | None, trial_id: int) -> None:
    """
    Check the trial that ``--trial-id`` loads from an optuna study, as rl_zoo3 opens the study.

    :param storage: the ``--storage`` value: an optuna storage URL, or a journal ``.log`` file
    :param study_name: the ``--study-name`` value
    :param trial_id: the ``--trial-id`` value: a trial's number in the study
    :raises ZooUsageError: without a storage or a study name, for a storage file or a study that does not exist,
        a storage that cannot be opened (see :func:`open_storage`), or for a trial number the study does not have
    """
    if storage is None or study_name is None:
        raise ZooUsageError("--trial-id needs --storage and --study-name, the optuna study to read the trial from")
    journal = storage.endswith(".log")
    file = storage if journal else storage.removeprefix("sqlite:///") if storage.startswith("sqlite:///") else None
    # Opening a missing file would create an empty storage; a server URL (postgresql://...) has no file
    if file is not None and not Path(file).is_file():
        raise ZooUsageError(f"--storage {storage}: no such file {file}{_file_hint(Path(file))}")
    optuna_storage = open_storage(storage)
    names = optuna.get_all_study_names(optuna_storage)
    if study_name not in names:
        hint = _did_you_mean(study_name, names) or f"; its studies: {', '.join(names) or 'none'}"
        raise ZooUsageError(f"--study-name {study_name!r}: no such study in {_storage_label(storage)}{hint}")
    n_trials = len(optuna.load_study(study_name=study_name, storage=optuna_storage).get_trials(deepcopy=False))
    if not 0 <= trial_id < n_trials:
        trials = f"{n_trials} trials, numbered 0 to {n_trials - 1}" if n_trials else "no trials"
        raise ZooUsageError(f"--trial-id {trial_id}: study {study_name!r} has {trials}")


def _check_saved_run(options: argparse.Namespace) -> None:
    """Check that ``enjoy`` finds the saved model its options name, as rl_zoo3 looks for it."""
    env_name = EnvironmentName(options.env)
    try:
        # It prints the run it picks; rl_zoo3's enjoy prints that again
        with contextlib.redirect_stdout(io.StringIO()):
            get_model_path(
                options.exp_id,
                options.folder,
                options.algo,
                env_name,
                options.load_best,
                options.load_checkpoint,
                options.load_last_checkpoint,
            )
    except (AssertionError, ValueError) as error:
        # rl_zoo3 saves runs as <folder>/<algo>/<env>_<n>
        runs = {
            f"{run.parent.name}/{run.name.rpartition('_')[0]}"
            for run in Path(options.folder).glob("*/*_[0-9]*")
            if run.is_dir()
        }
        wanted = f"{options.algo}/{env_name}"
        if wanted in runs:
            hint = ""  # rl_zoo3's message names the run or the file that is missing
        elif runs:
            hint = _did_you_mean(wanted, runs) or f"; runs there: {', '.join(sorted(runs))}"
        else:
            hint = f"; no runs in {options.folder}"
        raise ZooUsageError(f"{_one_line(str(error))}{hint}") from error


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
    hint = _did_you_mean(key, accepted) or f"; it takes: {', '.join(accepted)}"
    return f"algorithm {algo} ({algo_class.__name__}) does not accept the config key {key!r}{hint}"


def _close_match_hint(error: Exception, message: str) -> str:
    # A misspelled attribute (a class path's name) or choice
    if isinstance(error, AttributeError) and error.name is not None and error.obj is not None:
        return _did_you_mean(error.name, [name for name in dir(error.obj) if not name.startswith("_")])
    match = _NOT_ONE_OF.search(message)
    if match is None:
        return ""
    try:
        choices = ast.literal_eval(match.group(1))
    except (ValueError, SyntaxError):
        return ""
    return _did_you_mean(match.group(2), map(str, choices))


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
    message = _one_line(str(error))
    if not isinstance(error, ValueError):
        # The type says what a KeyError's "'n_timesteps'" or an empty AssertionError means
        message = f"{type(error).__name__}: {message}" if message else type(error).__name__
    return f"bad configuration for {algo}: {message}{_close_match_hint(error, message)}"


@contextlib.contextmanager
def _explained_config_errors(algo: str) -> Iterator[None]:
    # -optimize builds each trial's model after the setup: a key the algorithm rejects fails there
    try:
        yield
    except TypeError as error:
        explanation = explain_unexpected_keyword(error, algo)
        if explanation is None:
            raise
        raise ZooUsageError(explanation) from error


# ----- running rl_zoo3 -----


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
                reason = f"{type(error).__name__}: {_one_line(str(error))}"
                raise ZooUsageError(f"{option_string} {item}: cannot evaluate {value!r} ({reason}){quotes}") from error


def _zoo_options(command: str, zoo_args: Sequence[str]) -> argparse.Namespace:
    # Only the options sb3-safe checks, named and defaulted as rl_zoo3's; rl_zoo3 parses all of them itself
    parser = _OptionParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--algo", default="ppo")
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--gym-packages", nargs="+", default=[])
    parser.add_argument("--env-kwargs", nargs="+", action=_KeyValues)
    if command == "train":
        parser.add_argument("-f", "--log-folder", dest="folder", default="logs")
        parser.add_argument("-conf", "--conf-file")
        parser.add_argument("-params", "--hyperparams", nargs="+", action=_KeyValues)
        parser.add_argument("--eval-env-kwargs", nargs="+", action=_KeyValues)
        parser.add_argument("-i", "--trained-agent", default="")
        parser.add_argument("-optimize", "--optimize-hyperparameters", dest="optimize", action="store_true")
        parser.add_argument("--storage")
        parser.add_argument("--study-name")
        parser.add_argument("--trial-id", type=int)
    else:
        parser.add_argument("-f", "--folder", default="rl-trained-agents")
        parser.add_argument("--exp-id", type=int, default=0)
        parser.add_argument("--load-best", action="store_true")
        parser.add_argument("--load-checkpoint", type=int)
        parser.add_argument("--load-last-checkpoint", action="store_true")
    return parser.parse_known_args(list(zoo_args))[0]


def _checked_options(command: str, zoo_args: Sequence[str]) -> argparse.Namespace:
    register()
    options = _zoo_options(command, zoo_args)
    # rl_zoo3 imports them only after checking the id; environments they register must pass our check too
    for module in options.gym_packages:
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise ZooUsageError(f"--gym-packages {module}: {_one_line(str(error))}") from error
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
        except _SETUP_ERRORS as error:
            if new_run:
                # rl_zoo3 creates the run folder before the model: enjoy would take the empty one for the latest run
                shutil.rmtree(self.save_path, ignore_errors=True)
            if isinstance(error, ZooUsageError):
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
def _rl_zoo3_command(prog: str, args: Sequence[str]) -> Iterator[None]:
    """Run rl_zoo3's ``train()`` or ``enjoy()`` as the command ``prog args``, with sb3-safe's checks."""
    saved_argv, saved_error, saved_manager = sys.argv, argparse.ArgumentParser.error, rl_zoo3.train.ExperimentManager
    # They parse sys.argv, with parsers whose errors would print the usage too: one line instead
    sys.argv = [prog, *args]
    argparse.ArgumentParser.error = _raise_usage_error  # type: ignore[method-assign, assignment]
    # train() looks the class up in its module when it runs
    rl_zoo3.train.ExperimentManager = _CheckedExperimentManager  # type: ignore[misc]
    try:
        yield
    finally:
        sys.argv = saved_argv
        argparse.ArgumentParser.error = saved_error  # type: ignore[method-assign]
        rl_zoo3.train.ExperimentManager = saved_manager  # type: ignore[misc]


def _run_folders(folder: str, algo: str, env_id: str) -> set[Path]:
    return {path for path in Path(folder, algo).glob(f"{EnvironmentName(env_id)}_*") if path.is_dir()}


def train(zoo_args: Sequence[str], report: bool = True) -> RunReport | None:
    """
    Run rl_zoo3's trainer (``python -m rl_zoo3.train``) with sb3-safe's algorithms registered.

    Without ``--conf-file``, ``kl_ppo``, ``safe_a2c`` and ``ppo_lstm`` use the packaged ``zoo_configs/<algo>.yml``.
    Bad input fails before training: the options, the configuration file and its entry for the environment, the
    optuna storage of ``-optimize`` and the trial of ``--trial-id``, the types of the hyperparameters, and whatever
    the callbacks, wrappers, environments and the model reject when rl_zoo3 builds them.

    :param zoo_args: ``rl_zoo3.train``'s command-line arguments
    :param report: after a training run (not ``-optimize``), write a learning-curve PNG next to the saved
        model and evaluate the model for ``--eval-episodes`` episodes
    :return: the report, or None without one
    :raises ZooUsageError: bad input, in one line
    """
    options = _checked_options("train", zoo_args)
    zoo_args = list(zoo_args)
    if options.conf_file is None and (options.algo in ZOO_ALGOS or options.algo in PACKAGED_BY_DEFAULT):
        options.conf_file = str(config_path(options.algo))
        zoo_args += ["--conf-file", options.conf_file]
    # Without one, the stock algorithms read rl_zoo3's own files
    if options.conf_file is not None:
        check_config_file(options.conf_file, options.env)
    if options.trained_agent:
        check_trained_agent(options.trained_agent)
    if options.trial_id is not None:
        check_trial(options.storage, options.study_name, options.trial_id)
    elif options.optimize and options.storage is not None and not options.storage.endswith(".log"):
        # A database: its tables are created here, before rl_zoo3 opens it, and a bad URL fails in one line
        open_storage(options.storage)
    runs_before = _run_folders(options.folder, options.algo, options.env)
    with _rl_zoo3_command("sb3-safe train", zoo_args), _explained_config_errors(options.algo):
        rl_zoo3.train.train()
    if options.optimize or not report:
        return None
    env_name = EnvironmentName(options.env)
    new_runs = _run_folders(options.folder, options.algo, options.env) - runs_before
    trained = [run for run in new_runs if (run / f"{env_name}.zip").is_file()]
    if not trained:
        return None
    return report_run(max(trained, key=lambda run: run.stat().st_mtime), options.algo, options.env)


def enjoy(zoo_args: Sequence[str]) -> None:
    """
    Run rl_zoo3's ``enjoy`` (``python -m rl_zoo3.enjoy``) with sb3-safe's algorithms registered.

    :param zoo_args: ``rl_zoo3.enjoy``'s command-line arguments
    :raises ZooUsageError: bad options, or no saved model where they point, in one line
    """
    options = _checked_options("enjoy", zoo_args)
    # rl_zoo3 downloads the models missing from its default folder from the Hugging Face hub
    if "rl-trained-agents" not in options.folder:
        _check_saved_run(options)
    with _rl_zoo3_command("sb3-safe enjoy", zoo_args):
        zoo_enjoy()


@dataclass
class LearningCurve:
    """
    What the learning curve shows: the training episodes that rl_zoo3's ``Monitor`` wrappers logged in a run folder,
    smoothed over timesteps, and rl_zoo3's periodic evaluations.

    :param timesteps: the timestep at which each training episode ended (the lengths of the episodes summed in the
        order they ended, as SB3's plotter counts)
    :param returns: each training episode's return
    :param smoothed: at each episode's end, the mean return of the episodes that ended within the last ``window``
        timesteps
    :param window: the smoothing window, in timesteps
    :param eval_timesteps: the timestep of each evaluation (none without ``evaluations.npz``)
    :param eval_means: the mean return of each evaluation's episodes
    :param eval_stds: the standard deviation of each evaluation's episode returns
    """

    timesteps: np.ndarray
    returns: np.ndarray
    smoothed: np.ndarray
    window: float
    eval_timesteps: np.ndarray
    eval_means: np.ndarray
    eval_stds: np.ndarray


def smooth_over_timesteps(timesteps: np.ndarray, values: np.ndarray, window: float) -> np.ndarray:
    """
    A moving mean over a window of timesteps rather than of episodes: a window of N episodes spans few timesteps
    where episodes are short and many where they are long, so it lags most where the agent has improved most.

    :param timesteps: increasing timesteps, one per value
    :param values: the values
    :param window: the window's width in timesteps (> 0)
    :return: at each timestep ``t``, the mean of the values at timesteps in ``(t - window, t]``
    """
    # The window of point i starts at the first point after t_i - window; a prefix sum gives each window's sum
    starts = np.searchsorted(timesteps, timesteps - window, side="right")
    ends = np.arange(1, len(values) + 1)
    sums = np.concatenate([[0.0], np.cumsum(values, dtype=np.float64)])
    return (sums[ends] - sums[starts]) / (ends - starts)


def learning_curve_data(run_folder: Path, window: float | None = None) -> LearningCurve | None:
    """
    The data of a run's learning curve.

    :param run_folder: the run folder (``<log folder>/<algo>/<env>_<id>``), with the ``Monitor`` logs and, with
        ``--eval-freq`` > 0, rl_zoo3's ``evaluations.npz``
    :param window: the smoothing window in timesteps; None: :data:`SMOOTHING_FRACTION` of the run's timesteps
    :return: the curve, or None if no training episode finished
    """
    monitor = load_results(str(run_folder))
    if monitor.empty:
        return None
    timesteps, returns = (np.asarray(column, dtype=np.float64) for column in ts2xy(monitor, X_TIMESTEPS))
    if window is None:
        window = max(SMOOTHING_FRACTION * timesteps[-1], 1.0)
    eval_timesteps, eval_means, eval_stds = np.zeros(0), np.zeros(0), np.zeros(0)
    if (run_folder / EVALUATIONS).is_file():
        with np.load(run_folder / EVALUATIONS) as evaluations:
            eval_timesteps = np.asarray(evaluations["timesteps"], dtype=np.float64)
            # EvalCallback's results: one row of episode returns per evaluation
            results = np.asarray(evaluations["results"], dtype=np.float64)
        eval_means, eval_stds = results.mean(axis=1), results.std(axis=1)
    smoothed = smooth_over_timesteps(timesteps, returns, window)
    return LearningCurve(timesteps, returns, smoothed, window, eval_timesteps, eval_means, eval_stds)


def plot_learning_curve(run_folder: Path, title: str) -> Path | None:
    """
    Plot a run's learning curve (:func:`learning_curve_data`): each training episode's return, their mean over a
    window of timesteps, and rl_zoo3's evaluations.

    :param run_folder: the run folder (``<log folder>/<algo>/<env>_<id>``)
    :param title: the plot title
    :return: the PNG written into the run folder, or None if no episode finished
    """
    curve = learning_curve_data(run_folder)
    if curve is None:
        return None
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.scatter(curve.timesteps, curve.returns, s=6, alpha=0.3, color="tab:blue", label="training episode")
    ax.plot(curve.timesteps, curve.smoothed, color="tab:blue", label=f"mean over {curve.window:,.0f} timesteps")
    if len(curve.eval_timesteps):
        ax.errorbar(
            curve.eval_timesteps,
            curve.eval_means,
            yerr=curve.eval_stds,
            fmt="D",
            color="tab:orange",
            capsize=3,
            label="evaluation (mean +/- std)",
        )
    ax.set(xlabel="timesteps", ylabel="episode return", title=title)
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    path = run_folder / LEARNING_CURVE
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def report_run(run_folder: Path, algo: str, env_id: str) -> RunReport:
    """
    Plot the learning curve of a finished rl_zoo3 run and evaluate its saved model on an environment built as
    rl_zoo3's ``enjoy`` builds it (same wrappers, frame stacking and saved VecNormalize statistics).

    :param run_folder: the run folder (``<log folder>/<algo>/<env>_<id>``)
    :param algo: the zoo algorithm name
    :param env_id: the environment id
    :return: the report; the number of episodes is the run's ``--eval-episodes``
    """
    env_name = EnvironmentName(env_id)
    params_path = run_folder / env_name
    args = yaml.load((params_path / "args.yml").read_text(), Loader=yaml.UnsafeLoader)
    hyperparams, stats_path = get_saved_hyperparams(str(params_path), test_mode=True)
    # Command-line env_kwargs override the configuration's, as in rl_zoo3
    env_kwargs = args["env_kwargs"] or hyperparams.get("env_kwargs") or {}
    env = create_test_env(
        env_id,
        stats_path=stats_path,
        seed=args["seed"],
        should_render=False,
        hyperparams=hyperparams,
        env_kwargs=env_kwargs,
    )
    model_path = run_folder / f"{env_name}.zip"
    model = ALGOS[algo].load(model_path, device=args["device"])
    # rl_zoo3's choice: stochastic actions on Atari and MiniGrid, where deterministic policies can get stuck
    deterministic = not (ExperimentManager.is_atari(env_id) or ExperimentManager.is_minigrid(env_id))
    returns, _ = evaluate_policy(
        model, env, n_eval_episodes=args["eval_episodes"], deterministic=deterministic, return_episode_rewards=True
    )
    env.close()
    assert isinstance(returns, list)  # with return_episode_rewards=True
    curve = plot_learning_curve(run_folder, f"{algo} on {env_id} ({run_folder.name})")
    return RunReport(model_path, curve, [float(r) for r in returns], deterministic)
