"""
rl-zoo configurations of the benchmark suites: rl-zoo's tuned entries (or another source's settings) in one form,
and the masked-action task of ``examples/maskable.py``.
"""

import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import gymnasium as gym

ROOT = Path(__file__).parent.parent


@dataclass
class ZooConfig:
    """
    One rl-zoo hyperparameter entry, split the way rl-zoo's ExperimentManager uses it (or, with ``source``, the
    settings of another origin in the same form).

    :param algo: ``"ppo"``, ``"a2c"`` or ``"ppo_lstm"`` (the zoo file name)
    :param env_id: the environment
    :param zoo_key: the entry read (Hopper-v5 falls back to the Hopper-v4 entry)
    :param n_envs: number of parallel environments
    :param normalize: wrap in VecNormalize (with the algorithm's gamma, as rl-zoo does)
    :param zoo_timesteps: rl-zoo's training budget (the source's, with ``source``)
    :param kwargs: the algorithm's keyword arguments, schedules and ``policy_kwargs`` already resolved
    :param source: where the settings come from when not from rl-zoo (e.g. ``examples/maskable.py``), for reports
    :param normalize_reward: with ``normalize``, VecNormalize scales the rewards too (rl-zoo's default); False: the
        observations only
    """

    algo: str
    env_id: str
    zoo_key: str
    n_envs: int
    normalize: bool
    zoo_timesteps: int
    kwargs: dict[str, Any] = field(default_factory=dict)
    source: str | None = None
    normalize_reward: bool = True

    @property
    def gamma(self) -> float:
        return float(self.kwargs.get("gamma", 0.99))


def zoo_config(algo: str, env_id: str, **overrides: Any) -> ZooConfig:
    """
    Read rl-zoo's tuned entry from the installed ``rl_zoo3/hyperparams/<algo>.yml`` rather than retyping it.

    :param algo: ``"ppo"``, ``"a2c"`` or ``"ppo_lstm"``
    :param env_id: the environment; ``-v5`` falls back to the ``-v4`` entry (zoo has no v5 MuJoCo entries)
    :param overrides: keyword arguments replacing or adding to the zoo's (strings are parsed like zoo's)
    """
    import rl_zoo3

    return config_from_file(Path(rl_zoo3.__file__).parent / "hyperparams" / f"{algo}.yml", algo, env_id, **overrides)


def config_from_file(path: Path, algo: str, env_id: str, **overrides: Any) -> ZooConfig:
    """
    An entry of an rl-zoo-format YAML file (rl-zoo's own or ``sb3_safe/zoo_configs/``), read as ``zoo_config``
    reads rl-zoo's. A ``callback`` entry is kept out of ``kwargs`` (the variant chooses the guard).

    :param path: the YAML file
    :param algo: its name in reports (e.g. ``"kl_ppo"``)
    :param env_id: the environment; ``-v5`` falls back to the ``-v4`` entry when the file has no ``-v5`` one
    :param overrides: keyword arguments replacing or adding to the file's
    """
    import yaml

    entries = yaml.safe_load(path.read_text())
    key = env_id if env_id in entries else env_id.replace("-v5", "-v4")
    hyperparams = dict(entries[key])
    hyperparams.pop("callback", None)
    hyperparams.update(overrides)
    normalize = hyperparams.pop("normalize", False)
    if isinstance(normalize, str):  # zoo allows "dict(norm_obs=..., ...)"; not used by the entries read here
        raise ValueError(f"normalize={normalize!r}: keyword form not supported")
    n_envs = int(hyperparams.pop("n_envs", 1))
    zoo_timesteps = int(float(hyperparams.pop("n_timesteps")))
    hyperparams.pop("policy", None)  # "MlpPolicy" / "MlpLstmPolicy" in the entries used here: the variant chooses
    return ZooConfig(algo, env_id, key, n_envs, bool(normalize), zoo_timesteps, _resolve(hyperparams))


def other_config(source: str, env_id: str, n_envs: int = 1, timesteps: int = 0, **kwargs: Any) -> ZooConfig:
    """
    Settings that are not an rl-zoo entry (an example's, or the library's defaults plus ``kwargs``), in the same form.

    :param source: where they come from, for reports
    :param timesteps: the source's training budget (0: none)
    :param kwargs: the algorithm's keyword arguments (strings are parsed like zoo's)
    """
    return ZooConfig("-", env_id, "-", n_envs, False, timesteps, _resolve(kwargs), source=source)


#: The masked-action task of ``examples/maskable.py``, registered with gymnasium under this id (see
#: ``benchmarks.training.register_envs``)
MACHINE_SCHEDULING = "MachineScheduling-v0"


def maskable_example() -> ModuleType:
    """``examples/maskable.py`` as a module (loaded by path: ``examples`` is not a package)."""
    module = sys.modules.get("_sb3_safe_examples_maskable")
    if module is None:
        spec = importlib.util.spec_from_file_location("_sb3_safe_examples_maskable", ROOT / "examples" / "maskable.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return module


def machine_scheduling_env() -> gym.Env:
    """The example's env (the gymnasium entry point of ``MACHINE_SCHEDULING``)."""
    return maskable_example().MachineSchedulingEnv()


def maskable_config(**overrides: Any) -> ZooConfig:
    """
    MaskablePPO's settings of ``examples/maskable.py`` (rl-zoo has no MaskablePPO file), with ``overrides``.
    """
    example = maskable_example()
    kwargs = {**example.HYPERPARAMS, **overrides}
    return other_config(
        "`examples/maskable.py`", MACHINE_SCHEDULING, n_envs=example.N_ENVS, timesteps=example.TIMESTEPS, **kwargs
    )


def family_config(family: str, env_id: str, **overrides: Any) -> ZooConfig:
    """The settings a family starts from: rl-zoo's entry for the env, or for MaskablePPO the example's."""
    if family == "MaskablePPO":
        return maskable_config(**overrides)
    return zoo_config(ZOO_FILE[family], env_id, **overrides)


def _resolve(hyperparams: dict[str, Any]) -> dict[str, Any]:
    """Zoo's string values: ``lin_<x>`` schedules and ``policy_kwargs`` expressions (as rl-zoo evaluates them)."""
    import torch as th
    from rl_zoo3.utils import linear_schedule
    from stable_baselines3.common.sb2_compat.rmsprop_tf_like import RMSpropTFLike

    resolved = {}
    for key, value in hyperparams.items():
        if isinstance(value, str) and value.startswith("lin_"):
            value = linear_schedule(value[len("lin_") :])
        elif key == "policy_kwargs" and isinstance(value, str):
            value = eval(
                value, {"nn": th.nn, "th": th, "dict": dict, "RMSpropTFLike": RMSpropTFLike}
            )  # rl-zoo evaluates its own strings the same way
        resolved[key] = value
    return resolved


def describe_zoo(config: ZooConfig, timesteps: int) -> str:
    """One line for a report: the zoo entry (or other source), its budget and the one used."""
    norm = ", VecNormalize" if config.normalize else ""
    if config.source is not None:
        own = f" (its own: {config.zoo_timesteps:,})" if config.zoo_timesteps else ""
        return f"{config.env_id}: {config.source}{norm}, {timesteps:,} steps{own}"
    return (
        f"{config.env_id}: `{config.algo}.yml` `{config.zoo_key}`{norm}, {timesteps:,} steps (zoo: {config.zoo_timesteps:,})"
    )


#: The zoo file each algorithm's hyperparameters come from (MaskablePPO: none, see ``family_config``)
ZOO_FILE = {
    "PPO": "ppo",
    "KLAdaptivePPO": "ppo",
    "A2C": "a2c",
    "SafeA2C": "a2c",
    "RecurrentPPO": "ppo_lstm",
    "SAC": "sac",
    "TD3": "td3",
    "DQN": "dqn",
}
