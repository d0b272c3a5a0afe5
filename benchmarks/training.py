"""
One benchmark run: environment construction, a timed ``learn()`` that records a crash as a result, evaluation and
the end state of the model.
"""

import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from benchmarks.configs import MACHINE_SCHEDULING, ZooConfig, machine_scheduling_env
from benchmarks.variants import Variant, build_model, make_adaptive_lr, make_guard


def make_env(
    env_id: str,
    n_envs: int,
    seed: int,
    wrapper: Callable[[Any], Any] | None = None,
    normalize: bool = False,
    gamma: float = 0.99,
    normalize_reward: bool = True,
) -> Any:
    """
    A seeded, Monitor-wrapped vectorized env, with VecNormalize (zoo's settings) when ``normalize``: observations and,
    if ``normalize_reward``, rewards.
    """
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    register_envs(env_id)
    env = make_vec_env(env_id, n_envs=n_envs, seed=seed, wrapper_class=wrapper)
    return VecNormalize(env, gamma=gamma, norm_reward=normalize_reward) if normalize else env


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
    callbacks: list[Any] | None = None,
) -> dict[str, Any]:
    """
    Train one variant on one seed, catch whatever it raises, check its parameters, evaluate it.

    :param wrapper: gymnasium wrapper of the training env (a stress misconfiguration)
    :param eval_episodes: deterministic evaluation episodes after training; 0: no evaluation
    :param eval_wrapper: wrapper of the evaluation env (observation changes, not reward changes)
    :param prepare: called on the model before training (e.g. to push a bias into saturation)
    :param curve: record training episode returns
    :param callbacks: more callbacks, called after the variant's guard and adaptive lr (so they see the kept update)
    :return: one JSONL row (wall and CPU seconds of ``learn()``, error, finiteness, return, guard counts, the final
        log-std's largest entry; MaskablePPO: the actions sampled against the mask)
    """
    env = make_env(env_id, config.n_envs, seed, wrapper, config.normalize, config.gamma, config.normalize_reward)
    model = build_model(variant, env, seed, config.kwargs)
    if prepare is not None:
        prepare(model)
    guard = make_guard(variant)
    configured = config.kwargs.get("learning_rate")
    adaptive_lr = make_adaptive_lr(variant, configured if isinstance(configured, float | int) else None)
    curve_callback = episode_curve_callback() if curve else None
    masked = masked_actions_callback() if variant.algo == "MaskablePPO" else None
    callbacks = [cb for cb in (curve_callback, masked, guard, adaptive_lr, *(callbacks or ())) if cb is not None]
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
        guard_stalls=None if guard is None else sum(event.source == "stall" for event in guard.events),
        log_std_collapsed=log_std_collapsed(model),
        log_std_max=log_std_max(model),
        masked_actions=None if masked is None else masked.count,
        redone_updates=None if adaptive_lr is None else adaptive_lr.redone_updates,
        final_learning_rate=final_learning_rate(model),
    )
    if curve_callback is not None:
        row["curve"] = curve_callback.points
    env.close()
    return row


def final_learning_rate(model: Any) -> float | None:
    """The learning rate the next update would use (after any adaptation or rollback), None if none is defined."""
    schedule = getattr(model, "lr_schedule", None)
    return None if schedule is None else float(schedule(model._current_progress_remaining))


def _first_line(exc: Exception) -> str:
    """``Type: first line of the message`` (shortened)."""
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:160]}"


def skipped_updates(model: Any) -> int | None:
    """Optimizer steps skipped by the safe algorithms' guarded step (None for stock algorithms)."""
    skipped = getattr(model, "skipped_updates", None)
    return None if skipped is None else int(skipped)
