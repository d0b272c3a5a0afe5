"""
Shared pieces of the benchmark suites: rl-zoo configurations, algorithm variants, environment construction,
one timed run with evaluation, the process pool, JSONL I/O, markdown reports and plots.
"""

import importlib.util
import json
import multiprocessing
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import gymnasium as gym
import numpy as np

ROOT = Path(__file__).parent.parent
RESULTS = Path(__file__).parent / "results"
#: Hand-written reading of the numbers below this marker survives a rewrite of a report
NOTES_MARKER = "<!-- notes -->"
SIZES = ("tiny", "quick", "full")


# --------------------------------------------------------------------------------------------------------------
# rl-zoo configurations
# --------------------------------------------------------------------------------------------------------------


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
    """

    algo: str
    env_id: str
    zoo_key: str
    n_envs: int
    normalize: bool
    zoo_timesteps: int
    kwargs: dict[str, Any] = field(default_factory=dict)
    source: str | None = None

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


#: The masked-action task of ``examples/maskable.py``, registered with gymnasium under this id (see ``make_env``)
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


# --------------------------------------------------------------------------------------------------------------
# Variants: stock SB3 and sb3-safe
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """
    One way to train: an algorithm class, a policy, and optionally the guard.

    :param name: shown in tables
    :param algo: ``"PPO"``, ``"KLAdaptivePPO"``, ``"A2C"``, ``"SafeA2C"``, or sb3-contrib's ``"RecurrentPPO"`` or
        ``"MaskablePPO"``
    :param safe_policy: stock algorithm with sb3-safe's policy for it (``SafeMlpPolicy``, ``SafeMlpLstmPolicy``,
        ``SafeMaskableMlpPolicy``; the safe algorithms always use ``SafeMlpPolicy``)
    :param guard: NonFiniteGuardCallback mode, or None for no guard ("+guard" in a name is rollback mode)
    :param foreach: stock algorithm and policy, but the optimizer steps with ``foreach=True`` as sb3-safe's
        policies do (same values; isolates the cost of the safety from the optimizer's speed-up)
    :param log_std_low: lower bound of the safe policy's ``log_std_range`` (upper bound the default), None: default
    """

    name: str
    algo: str
    safe_policy: bool = False
    guard: str | None = None
    foreach: bool = False
    log_std_low: float | None = None


#: Off-policy algorithms timed with and without the guard (SB3's SAC, TD3, DQN)
OFF_POLICY = ("SAC", "TD3", "DQN")
VARIANTS = {
    variant.name: variant
    for variant in (
        Variant("PPO", "PPO"),
        Variant("PPO(foreach)", "PPO", foreach=True),
        Variant("PPO+SafeMlpPolicy", "PPO", safe_policy=True),
        Variant("PPO+SafeMlpPolicy(lo=-5)", "PPO", safe_policy=True, log_std_low=-5.0),
        Variant("PPO+guard(raise)", "PPO", guard="raise"),
        Variant("PPO+guard", "PPO", guard="rollback"),
        Variant("PPO+SafeMlpPolicy+guard", "PPO", safe_policy=True, guard="rollback"),
        Variant("KLAdaptivePPO", "KLAdaptivePPO"),
        Variant("KLAdaptivePPO+guard(raise)", "KLAdaptivePPO", guard="raise"),
        Variant("KLAdaptivePPO+guard", "KLAdaptivePPO", guard="rollback"),
        Variant("A2C", "A2C"),
        Variant("A2C(foreach)", "A2C", foreach=True),
        Variant("A2C+guard(raise)", "A2C", guard="raise"),
        Variant("A2C+guard", "A2C", guard="rollback"),
        Variant("A2C+SafeMlpPolicy", "A2C", safe_policy=True),
        Variant("A2C+SafeMlpPolicy(lo=-5)", "A2C", safe_policy=True, log_std_low=-5.0),
        Variant("SafeA2C", "SafeA2C"),
        Variant("SafeA2C+guard(raise)", "SafeA2C", guard="raise"),
        Variant("SafeA2C+guard", "SafeA2C", guard="rollback"),
        # sb3-contrib's algorithms have no sb3-safe algorithm class: the safe policy is the safe role, + the guard
        Variant("RecurrentPPO", "RecurrentPPO"),
        Variant("RecurrentPPO(foreach)", "RecurrentPPO", foreach=True),
        Variant("RecurrentPPO+SafeMlpLstmPolicy", "RecurrentPPO", safe_policy=True),
        Variant("RecurrentPPO+SafeMlpLstmPolicy(lo=-5)", "RecurrentPPO", safe_policy=True, log_std_low=-5.0),
        Variant("RecurrentPPO+SafeMlpLstmPolicy+guard", "RecurrentPPO", safe_policy=True, guard="rollback"),
        Variant("MaskablePPO", "MaskablePPO"),
        Variant("MaskablePPO(foreach)", "MaskablePPO", foreach=True),
        Variant("MaskablePPO+SafeMaskableMlpPolicy", "MaskablePPO", safe_policy=True),
        Variant("MaskablePPO+SafeMaskableMlpPolicy+guard", "MaskablePPO", safe_policy=True, guard="rollback"),
        # Off-policy algorithms have no safe policy or algorithm here: the guard is what sb3-safe adds to them
        *(
            Variant(f"{algo}{suffix}", algo, guard=guard)
            for algo in OFF_POLICY
            for suffix, guard in (("", None), ("+guard(raise)", "raise"), ("+guard", "rollback"))
        ),
    )
}
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


def build_model(variant: Variant, env: Any, seed: int, kwargs: dict[str, Any]) -> Any:
    """Construct the variant's model on ``env`` (CPU, quiet)."""
    from sb3_contrib import MaskablePPO, RecurrentPPO
    from stable_baselines3 import A2C, DQN, PPO, SAC, TD3
    from stable_baselines3.common.noise import NormalActionNoise

    from sb3_safe import KLAdaptivePPO, SafeA2C, SafeMaskableMlpPolicy, SafeMlpLstmPolicy, SafeMlpPolicy
    from sb3_safe.common.distributions import DEFAULT_LOG_STD_RANGE

    classes = {
        "PPO": PPO,
        "KLAdaptivePPO": KLAdaptivePPO,
        "A2C": A2C,
        "SafeA2C": SafeA2C,
        "RecurrentPPO": RecurrentPPO,
        "MaskablePPO": MaskablePPO,
        "SAC": SAC,
        "TD3": TD3,
        "DQN": DQN,
    }
    if "noise_type" in kwargs:  # rl-zoo's action-noise keys, turned into the noise object as its ExperimentManager does
        kwargs = dict(kwargs)
        noise_type, noise_std = kwargs.pop("noise_type"), float(kwargs.pop("noise_std"))
        if noise_type != "normal":
            raise ValueError(f"noise_type={noise_type!r}: only 'normal' is supported here")
        n_actions = env.action_space.shape[0]
        kwargs["action_noise"] = NormalActionNoise(np.zeros(n_actions), noise_std * np.ones(n_actions))
    if variant.safe_policy:
        policy = {"RecurrentPPO": SafeMlpLstmPolicy, "MaskablePPO": SafeMaskableMlpPolicy}.get(variant.algo, SafeMlpPolicy)
    else:
        policy = "MlpLstmPolicy" if variant.algo == "RecurrentPPO" else "MlpPolicy"
    if variant.log_std_low is not None:
        log_std_range = (variant.log_std_low, DEFAULT_LOG_STD_RANGE[1])
        kwargs = {**kwargs, "policy_kwargs": {**kwargs.get("policy_kwargs", {}), "log_std_range": log_std_range}}
    model = classes[variant.algo](policy, env, seed=seed, device="cpu", verbose=0, **kwargs)
    if variant.foreach:
        # Set on the built optimizer: passing optimizer_kwargs would replace A2C's RMSprop settings
        for group in model.policy.optimizer.param_groups:
            group["foreach"] = True
    return model


def make_guard(variant: Variant) -> Any:
    """
    A fresh guard callback for the variant, or None. Its events are counted in the JSONL rows; its per-event report
    goes to the temporary folder, not to the working directory the benchmark runs in.
    """
    import tempfile

    from sb3_safe import NonFiniteGuardCallback

    if variant.guard is None:
        return None
    report_dir = os.path.join(tempfile.gettempdir(), "sb3_safe_benchmark_guard")
    return NonFiniteGuardCallback(on_nonfinite=variant.guard, report_dir=report_dir)


# --------------------------------------------------------------------------------------------------------------
# Environments, training and evaluation
# --------------------------------------------------------------------------------------------------------------


def make_env(
    env_id: str,
    n_envs: int,
    seed: int,
    wrapper: Callable[[Any], Any] | None = None,
    normalize: bool = False,
    gamma: float = 0.99,
) -> Any:
    """A seeded, Monitor-wrapped vectorized env, with VecNormalize (zoo's settings) when ``normalize``."""
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    register_envs(env_id)
    env = make_vec_env(env_id, n_envs=n_envs, seed=seed, wrapper_class=wrapper)
    return VecNormalize(env, gamma=gamma) if normalize else env


def register_envs(env_id: str) -> None:
    """
    Make ``env_id`` known to gymnasium in this process: the maskable example's task, or rl-zoo's ``*NoVel`` envs
    (registered by importing ``rl_zoo3.import_envs``, only when needed: it tries many optional packages).
    """
    if env_id in gym.registry:
        return
    if env_id == MACHINE_SCHEDULING:
        gym.register(MACHINE_SCHEDULING, entry_point=machine_scheduling_env)
    else:
        import rl_zoo3.import_envs  # noqa: F401


def evaluate(model: Any, env_id: str, seed: int, episodes: int, wrapper: Callable[[Any], Any] | None = None) -> float:
    """
    Mean return of ``episodes`` deterministic episodes on a fresh env, with the training env's observation
    normalization frozen (rewards are the environment's own). MaskablePPO is evaluated with the env's action masks
    (sb3-contrib's ``evaluate_policy``), as it is trained; RecurrentPPO's ``predict`` carries its LSTM states.
    """
    from sb3_contrib import MaskablePPO
    from sb3_contrib.common.maskable.evaluation import evaluate_policy as evaluate_masked
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import VecNormalize

    train_env = model.get_env()
    eval_env = make_env(env_id, 1, seed + 1000, wrapper)
    if isinstance(train_env, VecNormalize):
        eval_env = VecNormalize(eval_env, training=False, norm_reward=False, gamma=train_env.gamma)
        eval_env.obs_rms = train_env.obs_rms
    evaluate_ = evaluate_masked if isinstance(model, MaskablePPO) else evaluate_policy
    mean_return, _ = evaluate_(model, eval_env, n_eval_episodes=episodes)
    return float(mean_return)


def episode_curve_callback() -> Any:
    """A callback recording (timestep, return) of every finished training episode in ``.points``."""
    from stable_baselines3.common.callbacks import BaseCallback

    class EpisodeCurve(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.points: list[tuple[int, float]] = []

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.points.append((self.num_timesteps, float(info["episode"]["r"])))
            return True

    return EpisodeCurve()


def masked_actions_callback() -> Any:
    """
    A callback counting, in ``.count``, the actions MaskablePPO sampled although the env's mask forbade them: with
    raw logits spread by more than sb3-contrib's masking constant (-1e8), the mask no longer removes an action.
    """
    from stable_baselines3.common.callbacks import BaseCallback

    class MaskedActions(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.count = 0

        def _on_step(self) -> bool:
            masks = self.locals.get("action_masks")
            if masks is not None:
                actions = np.asarray(self.locals["actions"]).reshape(len(masks))
                self.count += int((~np.asarray(masks, dtype=bool)[np.arange(len(masks)), actions]).sum())
            return True

    return MaskedActions()


def log_std_max(model: Any) -> float | None:
    """The largest log-std entry at the end (NaN if some entry is NaN), None for a policy without a log-std."""
    import torch as th

    from sb3_safe.common.exploration import policy_log_std

    found = policy_log_std(model)
    if found is None:
        return None
    with th.no_grad():
        log_std = found[0].detach()
        return float("nan") if bool(log_std.isnan().any()) else float(log_std.max())


def log_std_collapsed(model: Any) -> bool | None:
    """
    Whether some log-std entry ended at the lower bound of the policy's range (sb3-safe's ``log_std_range``, else
    the stock range of ``sb3_safe.common.exploration``): finite, but no longer exploring. None without a log-std.
    """
    import torch as th

    from sb3_safe.common.exploration import AT_BOUND_TOLERANCE, policy_log_std

    found = policy_log_std(model)
    if found is None:
        return None
    log_std, (low, _) = found
    with th.no_grad():
        # a NaN log-std has no bound to sit at
        return bool((log_std <= low + AT_BOUND_TOLERANCE).any())


def params_finite(model: Any) -> bool:
    """Whether every policy parameter is finite."""
    import torch as th

    return all(bool(th.isfinite(param).all()) for param in model.policy.parameters())


def train(
    variant: Variant,
    env_id: str,
    config: ZooConfig,
    timesteps: int,
    seed: int,
    eval_episodes: int,
    wrapper: Callable[[Any], Any] | None = None,
    eval_wrapper: Callable[[Any], Any] | None = None,
    prepare: Callable[[Any], None] | None = None,
    curve: bool = False,
) -> dict[str, Any]:
    """
    Train one variant on one seed, catch whatever it raises, check its parameters, evaluate it.

    :param wrapper: gymnasium wrapper of the training env (a stress misconfiguration)
    :param eval_episodes: deterministic evaluation episodes after training; 0: no evaluation
    :param eval_wrapper: wrapper of the evaluation env (observation changes, not reward changes)
    :param prepare: called on the model before training (e.g. to push a bias into saturation)
    :param curve: record training episode returns
    :return: one JSONL row (wall and CPU seconds of ``learn()``, error, finiteness, return, guard counts, the final
        log-std's largest entry; MaskablePPO: the actions sampled against the mask)
    """
    env = make_env(env_id, config.n_envs, seed, wrapper, config.normalize, config.gamma)
    model = build_model(variant, env, seed, config.kwargs)
    if prepare is not None:
        prepare(model)
    guard = make_guard(variant)
    curve_callback = episode_curve_callback() if curve else None
    masked = masked_actions_callback() if variant.algo == "MaskablePPO" else None
    callbacks = [cb for cb in (guard, curve_callback, masked) if cb is not None]
    error = None
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        model.learn(timesteps, callback=callbacks or None)
    except Exception as exc:  # a crash is a result here: recorded, not hidden
        error = _first_line(exc)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finite = params_finite(model)
    final, eval_error = float("nan"), None
    if error is None and finite and eval_episodes > 0:
        try:
            final = evaluate(model, env_id, seed, eval_episodes, eval_wrapper)
        except Exception as exc:  # e.g. a policy whose outputs are no longer valid
            eval_error = _first_line(exc)
    row: dict[str, Any] = dict(
        variant=variant.name,
        env=env_id,
        seed=seed,
        timesteps=timesteps,
        steps_done=int(model.num_timesteps),
        wall_s=wall,
        cpu_s=cpu,
        error=error,
        eval_error=eval_error,
        params_finite=finite,
        final_return=final,
        skipped_updates=skipped_updates(model),
        kl_beta=getattr(model, "kl_beta", None),
        guard_events=None if guard is None else len(guard.events),
        guard_rollbacks=None if guard is None else guard.n_rollbacks,
        guard_stopped=None if guard is None else guard.stop_reason is not None,
        log_std_collapsed=log_std_collapsed(model),
        log_std_max=log_std_max(model),
        masked_actions=None if masked is None else masked.count,
    )
    if curve_callback is not None:
        row["curve"] = curve_callback.points
    env.close()
    return row


def _first_line(exc: Exception) -> str:
    """``Type: first line of the message`` (shortened)."""
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:160]}"


def skipped_updates(model: Any) -> int | None:
    """Optimizer steps skipped by the safe algorithms' guarded step (None for stock algorithms)."""
    skipped = getattr(model, "skipped_updates", None)
    return None if skipped is None else int(skipped)


# --------------------------------------------------------------------------------------------------------------
# Processes, JSONL and machine information
# --------------------------------------------------------------------------------------------------------------


def _init_worker() -> None:
    import torch as th

    # One torch thread per process: N processes on N cores without oversubscription
    th.set_num_threads(1)


def run_parallel(function: Callable[[Any], list[dict[str, Any]]], jobs: list[Any], n_jobs: int) -> Iterator[dict[str, Any]]:
    """Run ``function`` on each job in up to ``n_jobs`` spawned processes; yield its rows as they finish."""
    if n_jobs <= 1:
        _init_worker()
        for job in jobs:
            yield from function(job)
        return
    with multiprocessing.get_context("spawn").Pool(n_jobs, initializer=_init_worker) as pool:
        for rows in pool.imap_unordered(function, jobs, chunksize=1):
            yield from rows


def machine_info() -> dict[str, Any]:
    """CPU, core count, load average and library versions."""
    import gymnasium
    import stable_baselines3
    import torch as th

    import sb3_safe

    cpu = platform.processor() or "unknown CPU"
    cpuinfo = Path("/proc/cpuinfo")
    models = [line for line in cpuinfo.read_text().splitlines() if line.startswith("model name")] if cpuinfo.exists() else []
    if models:
        cpu = models[0].split(":", 1)[1].strip()
    return dict(
        commit=_git_commit(),
        cpu=cpu,
        cores=os.cpu_count(),
        load_avg=round(os.getloadavg()[0], 2),
        python=platform.python_version(),
        torch=th.__version__,
        sb3=stable_baselines3.__version__,
        gymnasium=gymnasium.__version__,
        sb3_safe=sb3_safe.__version__,
    )


def _git_commit() -> str | None:
    """The repository's commit (``+dirty`` with uncommitted changes under ``sb3_safe/``): the code measured."""
    import subprocess

    root = Path(__file__).parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "sb3_safe"], cwd=root, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]], mode: str = "w") -> None:
    """Write (or append) rows, one JSON object per line, flushed as they come."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, mode) as file:
        for row in rows:
            file.write(json.dumps(row) + "\n")
            file.flush()


def read_jsonl(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The meta row (kind "meta", the last one if several) and the run rows of a suite's JSONL."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    metas = [row for row in rows if row.get("kind") == "meta"]
    return (metas[-1] if metas else {}), [row for row in rows if row.get("kind") != "meta"]


def run_suite(
    suite: str,
    out: Path,
    command: str,
    size: str,
    n_jobs: int,
    function: Callable[[Any], list[dict[str, Any]]],
    jobs: list[Any],
    budget: dict[str, Any],
) -> None:
    """Run a suite's jobs, write ``<suite>.jsonl`` (meta row first, completed with the end state)."""
    path = out / f"{suite}.jsonl"
    meta = dict(kind="meta", suite=suite, command=command, size=size, jobs=n_jobs, budget=budget, **machine_info())
    write_jsonl(path, [meta])
    start = time.perf_counter()
    for done, row in enumerate(run_parallel(function, jobs, n_jobs), start=1):
        write_jsonl(path, [dict(kind="run", **row)], mode="a")
        print(f"[{suite} row {done}] " + _summary(row), flush=True)
    meta.update(wall_s=time.perf_counter() - start, load_avg_after=round(os.getloadavg()[0], 2))
    write_jsonl(path, [meta], mode="a")


def _summary(row: dict[str, Any]) -> str:
    keys = ("config", "env", "variant", "seed", "pair", "final_return", "steps_per_s", "wall_s", "error")
    return " ".join(
        f"{key}={row[key]:.4g}" if isinstance(row[key], float) else f"{key}={row[key]}" for key in keys if key in row
    )


# --------------------------------------------------------------------------------------------------------------
# Reports and plots
# --------------------------------------------------------------------------------------------------------------


def report_header(title: str, meta: dict[str, Any], budget_lines: list[str]) -> list[str]:
    """Title, the command, machine, versions, budget, load and wall time of a report."""
    wall = f"{meta['wall_s'] / 60:.1f} min wall" if "wall_s" in meta else "run incomplete"
    return [
        f"# {title}",
        "",
        f"Command: `{meta.get('command', '?')}` (size `{meta.get('size')}`, {meta.get('jobs')} processes, 1 torch thread"
        f" each; {wall})",
        "",
        f"- Machine: {meta.get('cpu')}, {meta.get('cores')} cores, shared with other jobs (1-min load average before /"
        f" after: {meta.get('load_avg')} / {meta.get('load_avg_after', '?')})",
        f"- Versions: Python {meta.get('python')}, torch {meta.get('torch')}, SB3 {meta.get('sb3')}, gymnasium"
        f" {meta.get('gymnasium')}, sb3-safe {meta.get('sb3_safe')}"
        + (f" (commit {meta['commit']})" if meta.get("commit") else ""),
        *[f"- {line}" for line in budget_lines],
        "",
    ]


def write_report(path: Path, lines: list[str]) -> None:
    """Write a markdown report, keeping the hand-written notes below NOTES_MARKER of an existing one."""
    notes = path.read_text().partition(NOTES_MARKER)[2] if path.exists() else ""
    path.write_text("\n".join(lines) + "\n\n" + NOTES_MARKER + (notes or "\n"))
    print(f"wrote {path}")


def table(header: list[str], rows: list[list[Any]]) -> list[str]:
    """A markdown table."""
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows],
    ]


def mean_std(values: Iterable[float], digits: int = 1) -> str:
    """``mean +- std`` over the finite values, with ``(n=k)`` when some were not finite."""
    array = np.asarray(list(values), dtype=float)
    finite = array[np.isfinite(array)]
    if not len(finite):
        return "n/a"
    text = f"{finite.mean():.{digits}f} +- {finite.std():.{digits}f}"
    return text if len(finite) == len(array) else f"{text} (n={len(finite)})"


def pyplot() -> Any:
    """matplotlib's pyplot with the file-only backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(figure: Any, path: Path) -> None:
    """Save and close a figure."""
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot().close(figure)


def smoothed_curve(points: list[tuple[int, float]], grid: np.ndarray, window: int = 20) -> np.ndarray:
    """Mean return of the last ``window`` training episodes finished by each grid timestep."""
    steps = np.array([point[0] for point in points])
    returns = np.array([point[1] for point in points])
    values = np.full(len(grid), np.nan)
    for i, step in enumerate(grid):
        done = returns[steps <= step] if len(steps) else returns
        if len(done):
            values[i] = done[-window:].mean()
    return values
