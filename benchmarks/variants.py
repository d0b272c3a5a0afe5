"""
The ways a benchmark trains: stock SB3 / sb3-contrib algorithms and sb3-safe's policies, algorithms and guard.
"""

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

import numpy as np


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
    :param adaptive_lr: with :class:`~sb3_safe.KLAdaptiveLRCallback` (its defaults) ("+KL-lr" in a name)
    :param target_kl: SB3's ``target_kl`` early stopping of PPO's epochs ("(target_kl=...)" in a name)
    :param sbx_lr: SBX's per-minibatch adaptive learning rate (:class:`benchmarks.peers.SBXAdaptiveLR`, "+SBX-lr")
    :param lr_capped_at_configured: the adaptive lr's upper bound is the configured (tuned) learning rate: it may
        lower it, never raise it ("+KL-lr(<=tuned)" in a name)
    :param normalize_value: the safe algorithm's ``normalize_value`` ("(normalize_value)" in a name: True); None: its
        default
    :param normalize_observations: the safe policy's ``normalize_observations`` (sb3-safe's policies only); None: its
        default (``False`` under a stock algorithm; the safe algorithms' ``"auto"``, off where their env's
        ``VecNormalize`` normalizes the observations)
    """

    name: str
    algo: str
    safe_policy: bool = False
    guard: str | None = None
    foreach: bool = False
    log_std_low: float | None = None
    adaptive_lr: bool = False
    target_kl: float | None = None
    sbx_lr: bool = False
    lr_capped_at_configured: bool = False
    normalize_value: bool | None = None
    normalize_observations: bool | None = None


#: sb3-safe's algorithm classes (the others are SB3's or sb3-contrib's)
SAFE_ALGORITHM_CLASSES = ("KLAdaptivePPO", "SafeA2C")
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
        # The adaptive learning rate alone (overhead) and the guard on sb3-contrib's algorithms with their own policies
        *(
            Variant(f"{algo}+KL-lr", algo, adaptive_lr=True)
            for algo in ("PPO", "KLAdaptivePPO", "A2C", "SafeA2C", "RecurrentPPO", "MaskablePPO")
        ),
        *(
            Variant(f"{algo}{suffix}", algo, guard=guard)
            for algo in ("RecurrentPPO", "MaskablePPO")
            for suffix, guard in (("+guard(raise)", "raise"), ("+guard", "rollback"))
        ),
        # The train-through map (robustness): peers' learning-rate controllers and sb3-safe's adaptive learning rate
        Variant("PPO(target_kl=0.01)", "PPO", target_kl=0.01),
        Variant("PPO+SBX-lr", "PPO", sbx_lr=True),
        Variant("PPO+SafeMlpPolicy+guard+KL-lr", "PPO", safe_policy=True, guard="rollback", adaptive_lr=True),
        Variant(
            "PPO+SafeMlpPolicy+guard+KL-lr(<=tuned)",
            "PPO",
            safe_policy=True,
            guard="rollback",
            adaptive_lr=True,
            lr_capped_at_configured=True,
        ),
        Variant("KLAdaptivePPO+guard+KL-lr", "KLAdaptivePPO", guard="rollback", adaptive_lr=True),
        Variant("A2C+SafeMlpPolicy+guard", "A2C", safe_policy=True, guard="rollback"),
        Variant("A2C+SafeMlpPolicy+guard+KL-lr", "A2C", safe_policy=True, guard="rollback", adaptive_lr=True),
        Variant("SafeA2C+guard+KL-lr", "SafeA2C", guard="rollback", adaptive_lr=True),
        # Value-target normalization: is it free where the reward scale is already right?
        Variant("KLAdaptivePPO(normalize_value)", "KLAdaptivePPO", normalize_value=True),
        Variant("SafeA2C(normalize_value)", "SafeA2C", normalize_value=True),
        # What the two normalizations on by default cost (overhead): the safe algorithms without them
        *(
            Variant(f"{algo}(no normalization)", algo, normalize_value=False, normalize_observations=False)
            for algo in SAFE_ALGORITHM_CLASSES
        ),
        Variant("RecurrentPPO(target_kl=0.01)", "RecurrentPPO", target_kl=0.01),
        Variant("RecurrentPPO+SafeMlpLstmPolicy+KL-lr", "RecurrentPPO", safe_policy=True, adaptive_lr=True),
        Variant("MaskablePPO+SafeMaskableMlpPolicy+KL-lr", "MaskablePPO", safe_policy=True, adaptive_lr=True),
        Variant(
            "RecurrentPPO+SafeMlpLstmPolicy+guard+KL-lr", "RecurrentPPO", safe_policy=True, guard="rollback", adaptive_lr=True
        ),
        Variant("MaskablePPO(target_kl=0.01)", "MaskablePPO", target_kl=0.01),
        Variant(
            "MaskablePPO+SafeMaskableMlpPolicy+guard+KL-lr",
            "MaskablePPO",
            safe_policy=True,
            guard="rollback",
            adaptive_lr=True,
        ),
        # Off-policy algorithms have no safe policy or algorithm here: the guard is what sb3-safe adds to them
        *(
            Variant(f"{algo}{suffix}", algo, guard=guard)
            for algo in OFF_POLICY
            for suffix, guard in (("", None), ("+guard(raise)", "raise"), ("+guard", "rollback"))
        ),
    )
}


def guarded(name: str, mode: str | None) -> Variant:
    """
    The variant called ``name``, with a guard in ``mode`` if it has none (``mode`` None: as it is).

    :param name: a key of :data:`VARIANTS`
    :param mode: a NonFiniteGuardCallback mode, or None
    """
    variant = VARIANTS[name]
    return variant if mode is None or variant.guard is not None else dataclasses.replace(variant, guard=mode)


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
    if variant.target_kl is not None:
        kwargs = {**kwargs, "target_kl": variant.target_kl}
    if variant.normalize_value is not None:
        if variant.algo not in SAFE_ALGORITHM_CLASSES:
            raise ValueError(f"variant {variant.name}: normalize_value is a keyword of KLAdaptivePPO and SafeA2C only")
        kwargs = {**kwargs, "normalize_value": variant.normalize_value}
    setting = variant.normalize_observations
    if setting is not None and not (variant.safe_policy or variant.algo in SAFE_ALGORITHM_CLASSES):
        raise ValueError(f"variant {variant.name}: normalize_observations is a keyword of sb3-safe's policies only")
    if setting is not None:
        kwargs = {**kwargs, "policy_kwargs": {**kwargs.get("policy_kwargs", {}), "normalize_observations": setting}}
    model = classes[variant.algo](policy, env, seed=seed, device="cpu", verbose=0, **kwargs)
    if variant.sbx_lr:
        from benchmarks.peers import SBXAdaptiveLR

        SBXAdaptiveLR(model)
    if variant.foreach:
        # Set on the built optimizer: passing optimizer_kwargs would replace A2C's RMSprop settings
        for group in model.policy.optimizer.param_groups:
            group["foreach"] = True
    return model


def make_adaptive_lr(variant: Variant, configured_learning_rate: float | None = None) -> Any:
    """
    A fresh :class:`~sb3_safe.KLAdaptiveLRCallback` for the variant, or None: its defaults, or (``lr_capped_at_configured``)
    ``lr_bounds`` from its lowest default rate to ``configured_learning_rate``.
    """
    from sb3_safe import KLAdaptiveLRCallback
    from sb3_safe.common.adaptive_lr import LOWEST_LEARNING_RATE

    if not variant.adaptive_lr:
        return None
    if not variant.lr_capped_at_configured:
        return KLAdaptiveLRCallback()
    if configured_learning_rate is None:
        raise ValueError(f"variant {variant.name} caps the learning rate at the configured one: pass it")
    return KLAdaptiveLRCallback(lr_bounds=(min(LOWEST_LEARNING_RATE, configured_learning_rate), configured_learning_rate))


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
