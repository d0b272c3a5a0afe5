"""
:class:`~sb3_safe.KLAdaptivePPO` and :class:`~sb3_safe.SafeA2C` as the rl_zoo3 algorithms ``kl_ppo`` and
``safe_a2c``: their registration, their optuna samplers and trial converters, and the packaged zoo-format
configurations.
"""

from pathlib import Path
from typing import Any

import optuna
from rl_zoo3 import ALGOS
from rl_zoo3.hyperparams_opt import (
    HYPERPARAMS_CONVERTER,
    HYPERPARAMS_SAMPLER,
    convert_onpolicy_params,
    sample_a2c_params,
    sample_ppo_params,
)
from stable_baselines3.common.base_class import BaseAlgorithm

from sb3_safe.a2c_safe import SafeA2C
from sb3_safe.common.adaptive_lr import ONE_STEP
from sb3_safe.ppo_kl import KLAdaptivePPO
from sb3_safe.zoo.errors import ZooUsageError

#: sb3-safe's algorithms under their zoo names
ZOO_ALGOS: dict[str, type[BaseAlgorithm]] = {"kl_ppo": KLAdaptivePPO, "safe_a2c": SafeA2C}
#: the packaged zoo configurations, one ``<algo>.yml`` per algorithm
CONFIG_DIR = Path(__file__).parent.parent / "zoo_configs"
#: The zoo algorithms that train with their packaged configuration without ``--conf-file`` (the safe policies and the
#: guard): every algorithm with a file in CONFIG_DIR, sb3-safe's own and the stock ones (ppo, a2c, ppo_lstm)
PACKAGED_BY_DEFAULT = tuple(sorted(path.stem for path in CONFIG_DIR.glob("*.yml")))


def register() -> None:
    """Add ``kl_ppo`` and ``safe_a2c`` to rl_zoo3's algorithms, samplers and trial converters (idempotent)."""
    # rl_zoo3's train, enjoy and ExperimentManager all read these very dicts when they run
    ALGOS.update(ZOO_ALGOS)
    HYPERPARAMS_SAMPLER.update(kl_ppo=sample_kl_ppo_params, safe_a2c=sample_safe_a2c_params)
    HYPERPARAMS_CONVERTER.update(dict.fromkeys(ZOO_ALGOS, convert_safe_params))


def config_path(algo: str) -> Path:
    """
    The packaged zoo configuration of an algorithm.

    :param algo: an algorithm of :data:`PACKAGED_BY_DEFAULT`
    :return: the path of ``zoo_configs/<algo>.yml`` inside the installed package
    """
    path = CONFIG_DIR / f"{algo}.yml"
    if not path.is_file():
        available = ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.yml")))
        raise ZooUsageError(f"no packaged configuration for {algo!r}; available: {available}")
    return path


def _sample_policy_bounds(trial: optuna.Trial, n_actions: int) -> dict[str, float]:
    # rl_zoo3 passes n_actions > 0 only for Box action spaces: tune the log-std range there, the logit bound else
    if n_actions > 0:
        return {
            "log_std_min": trial.suggest_float("log_std_min", -20.0, -2.0),
            "log_std_max": trial.suggest_float("log_std_max", 0.0, 2.0),
        }
    return {"logit_bound": trial.suggest_float("logit_bound", 2.0, 20.0, log=True)}


#: The range the adaptive learning rate's target is sampled from, a decade each way around its default: kl_ppo.yml's
#: adaptive_kl_target 0.03 (the callback aims at it), the A2C-style default for safe_a2c
ADAPTIVE_LR_TARGETS = {
    "kl_ppo": (0.003, 0.3),
    "safe_a2c": (ONE_STEP.target_kl / 10, ONE_STEP.target_kl * 10),
}


def _sample_adaptive_lr(trial: optuna.Trial, algo: str) -> dict[str, float]:
    low, high = ADAPTIVE_LR_TARGETS[algo]
    return {"adaptive_lr_target_kl": trial.suggest_float("adaptive_lr_target_kl", low, high, log=True)}


def _sample_value_normalization(trial: optuna.Trial) -> dict[str, bool]:
    # The default ("auto") turns it on unless VecNormalize normalizes the rewards (benchmarks/results/learning.md):
    # the tuning tries both, whatever the entry's `normalize`
    return {"normalize_value": trial.suggest_categorical("normalize_value", [False, True])}


def _move_policy_bounds(hyperparams: dict[str, Any]) -> dict[str, Any]:
    # The safe policies take the bounds as policy keywords; the algorithms the adaptive lr's as `adaptive_lr`
    hyperparams = dict(hyperparams)
    if "adaptive_lr_target_kl" in hyperparams:
        hyperparams["adaptive_lr"] = {"target_kl": hyperparams.pop("adaptive_lr_target_kl")}
    policy_kwargs = dict(hyperparams.get("policy_kwargs", {}))
    if "log_std_min" in hyperparams:
        policy_kwargs["log_std_range"] = (hyperparams.pop("log_std_min"), hyperparams.pop("log_std_max"))
    if "logit_bound" in hyperparams:
        policy_kwargs["logit_bound"] = hyperparams.pop("logit_bound")
    return {**hyperparams, "policy_kwargs": policy_kwargs}


def sample_kl_ppo_params(trial: optuna.Trial, n_actions: int, n_envs: int, additional_args: dict) -> dict[str, Any]:
    """
    Sampler for KLAdaptivePPO: rl_zoo3's PPO sampler, plus the KL target d_targ and the initial penalty
    coefficient, the adaptive learning rate's target (``adaptive_lr``), ``normalize_value``, and the policy's
    ``log_std_range`` (Box actions) or ``logit_bound`` (discrete actions).

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
    bounds = _sample_policy_bounds(trial, n_actions)
    extras = {**_sample_adaptive_lr(trial, "kl_ppo"), **_sample_value_normalization(trial)}
    return _move_policy_bounds({**hyperparams, **extras, **bounds})


def sample_safe_a2c_params(trial: optuna.Trial, n_actions: int, n_envs: int, additional_args: dict) -> dict[str, Any]:
    """
    Sampler for SafeA2C: rl_zoo3's A2C sampler plus the adaptive learning rate's target (``adaptive_lr``),
    ``normalize_value``, and the policy's ``log_std_range`` (Box actions) or ``logit_bound`` (discrete actions).

    :param trial: the optuna trial
    :param n_actions: the action dimension for Box action spaces, else 0
    :param n_envs: the number of environments
    :param additional_args: rl_zoo3's extra sampler arguments
    :return: the algorithm's keyword arguments
    """
    hyperparams = sample_a2c_params(trial, n_actions, n_envs, additional_args)
    bounds = _sample_policy_bounds(trial, n_actions)
    extras = {**_sample_adaptive_lr(trial, "safe_a2c"), **_sample_value_normalization(trial)}
    return _move_policy_bounds({**hyperparams, **extras, **bounds})


def convert_safe_params(sampled_params: dict[str, Any]) -> dict[str, Any]:
    """
    The keyword arguments of a finished trial of ``kl_ppo`` or ``safe_a2c``, from its raw ``trial.params``
    (what rl_zoo3 uses for ``--storage ... --study-name ... --trial-id N``).

    :param sampled_params: ``trial.params``
    :return: the algorithm's keyword arguments, as the sampler returned them
    """
    return _move_policy_bounds(convert_onpolicy_params(sampled_params))
