"""
sb3-safe in rl-baselines3-zoo: :class:`~sb3_safe.KLAdaptivePPO` and :class:`~sb3_safe.SafeA2C` as the zoo
algorithms ``kl_ppo`` and ``safe_a2c``, their optuna samplers, the packaged zoo-format configurations, and
rl_zoo3's own ``train`` / ``enjoy`` run with them registered.

Needs the ``zoo`` extra (rl_zoo3, optuna, matplotlib): ``pip install "sb3-safe[zoo]"``.
"""

import argparse
import contextlib
import difflib
import importlib
import inspect
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import matplotlib.pyplot as plt
import numpy as np
import optuna
import yaml
from huggingface_sb3 import EnvironmentName
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
from rl_zoo3.train import train as zoo_train
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.monitor import load_results
from stable_baselines3.common.results_plotter import X_TIMESTEPS, plot_results

from sb3_safe.a2c_safe import SafeA2C
from sb3_safe.ppo_kl import KLAdaptivePPO

#: sb3-safe's algorithms under their zoo names
ZOO_ALGOS: dict[str, type[BaseAlgorithm]] = {"kl_ppo": KLAdaptivePPO, "safe_a2c": SafeA2C}
#: the packaged zoo configurations, one ``<algo>.yml`` per algorithm
CONFIG_DIR = Path(__file__).parent / "zoo_configs"
#: file name of the learning curve written into the run folder
LEARNING_CURVE = "learning_curve.png"

# CPython's message when a constructor gets a keyword it does not take
_UNEXPECTED_KEYWORD = re.compile(r"(\w+)\.__init__\(\) got an unexpected keyword argument '(\w+)'")


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
        matches = _close_matches(algo, ALGOS)
        hint = f"did you mean: {', '.join(matches)}?" if matches else f"choose from: {', '.join(ALGOS)}"
        raise ZooUsageError(f"unknown algorithm {algo!r}; {hint}")


def check_env(env_id: str) -> None:
    """
    :param env_id: a gymnasium environment id
    :raises ZooUsageError: naming the close matches, if gymnasium's registry does not hold it
    """
    if env_id not in gym.registry:
        matches = _close_matches(env_id, gym.registry)
        hint = f"did you mean: {', '.join(matches)}?" if matches else "no close match in gymnasium's registry"
        raise ZooUsageError(f"unknown environment id {env_id!r}; {hint}")


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
    matches = _close_matches(key, accepted)
    hint = f"did you mean: {', '.join(matches)}?" if matches else f"it takes: {', '.join(accepted)}"
    return f"algorithm {algo} ({algo_class.__name__}) does not accept the config key {key!r}; {hint}"


@contextlib.contextmanager
def _explained_config_errors(algo: str) -> Iterator[None]:
    try:
        yield
    except TypeError as error:
        explanation = explain_unexpected_keyword(error, algo)
        if explanation is None:
            raise
        raise ZooUsageError(explanation) from error


# ----- running rl_zoo3 -----


def _zoo_options(zoo_args: Sequence[str], default_folder: str) -> argparse.Namespace:
    # Only the options sb3-safe needs to read; rl_zoo3 parses all of them itself (same defaults)
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--algo", default="ppo")
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--gym-packages", nargs="+", default=[])
    parser.add_argument("-conf", "--conf-file")
    parser.add_argument("-f", "--log-folder", "--folder", dest="folder", default=default_folder)
    parser.add_argument("-optimize", "--optimize-hyperparameters", dest="optimize", action="store_true")
    return parser.parse_known_args(list(zoo_args))[0]


def _checked_options(zoo_args: Sequence[str], default_folder: str) -> argparse.Namespace:
    register()
    options = _zoo_options(zoo_args, default_folder)
    # rl_zoo3 imports them only after checking the id; environments they register must pass our check too
    for module in options.gym_packages:
        importlib.import_module(module)
    check_algo(options.algo)
    check_env(options.env)
    return options


@contextlib.contextmanager
def _argv(prog: str, args: Sequence[str]) -> Iterator[None]:
    # rl_zoo3's train() and enjoy() parse sys.argv
    saved = sys.argv
    sys.argv = [prog, *args]
    try:
        yield
    finally:
        sys.argv = saved


def _run_folders(folder: str, algo: str, env_id: str) -> set[Path]:
    return {path for path in Path(folder, algo).glob(f"{EnvironmentName(env_id)}_*") if path.is_dir()}


def train(zoo_args: Sequence[str], report: bool = True) -> RunReport | None:
    """
    Run rl_zoo3's trainer (``python -m rl_zoo3.train``) with sb3-safe's algorithms registered.

    Without ``--conf-file``, ``kl_ppo`` and ``safe_a2c`` use the packaged ``zoo_configs/<algo>.yml``.

    :param zoo_args: ``rl_zoo3.train``'s command-line arguments
    :param report: after a training run (not ``-optimize``), write a learning-curve PNG next to the saved
        model and evaluate the model for ``--eval-episodes`` episodes
    :return: the report, or None without one
    :raises ZooUsageError: unknown algorithm or environment id, or a configuration key the algorithm rejects
    """
    options = _checked_options(zoo_args, default_folder="logs")
    zoo_args = list(zoo_args)
    if options.conf_file is None and options.algo in ZOO_ALGOS:
        zoo_args += ["--conf-file", str(config_path(options.algo))]
    runs_before = _run_folders(options.folder, options.algo, options.env)
    with _argv("sb3-safe train", zoo_args), _explained_config_errors(options.algo):
        zoo_train()
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
    :raises ZooUsageError: unknown algorithm or environment id
    """
    _checked_options(zoo_args, default_folder="rl-trained-agents")
    with _argv("sb3-safe enjoy", zoo_args):
        zoo_enjoy()


def plot_learning_curve(run_folder: Path, title: str) -> Path | None:
    """
    Plot the training episode returns that rl_zoo3's ``Monitor`` wrappers logged in a run folder.

    :param run_folder: the run folder (``<log folder>/<algo>/<env>_<id>``)
    :param title: the plot title
    :return: the PNG written into the run folder, or None if no episode finished
    """
    if load_results(str(run_folder)).empty:
        return None
    # SB3's plotter: each episode's return, and the mean over 100 episodes once there are that many
    plot_results([str(run_folder)], None, X_TIMESTEPS, title, figsize=(8, 4))
    path = run_folder / LEARNING_CURVE
    plt.savefig(path, dpi=100)
    plt.close()
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
