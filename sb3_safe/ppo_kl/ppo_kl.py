"""KLAdaptivePPO: PPO's clipped surrogate plus the adaptive KL penalty of the PPO paper, with numerical guards."""

import io
import math
import pathlib
from typing import Any, ClassVar, TypeVar

import torch as th
from gymnasium import spaces
from stable_baselines3 import PPO
from stable_baselines3.common.buffers import DictRolloutBuffer, RolloutBuffer
from stable_baselines3.common.policies import ActorCriticPolicy, BasePolicy
from stable_baselines3.common.type_aliases import GymEnv, MaybeCallback, Schedule
from torch.nn import functional as F

from sb3_safe.common.adaptive_lr import ADAPTIVE_LR_CALLBACK, check_adaptive_lr, with_adaptive_lr
from sb3_safe.common.buffers import KLDictRolloutBuffer, KLDictRolloutBufferSamples, KLRolloutBuffer, KLRolloutBufferSamples
from sb3_safe.common.checkpoints import continue_stock_checkpoint, with_settings_of_older_checkpoints
from sb3_safe.common.kl import analytic_kl, approx_kl, clamp_log_ratio, has_analytic_kl
from sb3_safe.common.normalized_rollout import NormalizedRollout
from sb3_safe.common.observation_norm import decide_normalize_observations, warn_if_normalized_twice
from sb3_safe.common.policies import SafeActorCriticPolicy, SafeCnnPolicy, SafeMultiInputPolicy, outside_rollouts
from sb3_safe.common.updates import (
    GuardedOptimizerStep,
    normalize_advantages,
    read_from_zero_past_the_end,
    write_last_update_statistics,
)
from sb3_safe.common.value_norm import (
    NormalizeValue,
    check_normalize_value,
    explained_variance_float64,
    install_value_normalization,
    record_value_statistics,
    resolve_normalize_value,
    value_head,
)

SelfKLAdaptivePPO = TypeVar("SelfKLAdaptivePPO", bound="KLAdaptivePPO")

#: Batch size of the no-gradient pass that measures the KL over the rollout
_MEASURE_BATCH_SIZE = 1024


def adapt_kl_beta(
    beta: float, kl: float, target: float, tolerance: float, factor: float, bounds: tuple[float, float]
) -> float:
    """
    The adaptive KL coefficient rule of the PPO paper (Schulman et al. 2017, sec. 4), clamped to ``bounds``.

    ``kl < target / tolerance``: divide beta by ``factor``; ``kl > target * tolerance``: multiply it; otherwise
    (also for a NaN ``kl``) keep it.

    :param beta: current coefficient
    :param kl: mean KL(pi_old || pi) measured after the update phase
    :param target: d_targ
    :param tolerance: 1.5 in the paper
    :param factor: 2 in the paper
    :param bounds: ``(lowest, highest)`` allowed coefficient
    """
    if kl < target / tolerance:
        beta /= factor
    elif kl > target * tolerance:
        beta *= factor
    return min(max(beta, bounds[0]), bounds[1])


class KLAdaptivePPO(PPO):
    """
    PPO with the clipped surrogate plus the adaptive KL penalty of the PPO paper, built so it cannot blow up.

    The paper is Schulman et al. 2017 (section 4). The penalty coefficient is bounded, the KL is the analytic mean
    ``KL(pi_old || pi)`` (never a max over samples, never the wrong direction), ``log_ratio`` is clamped before
    ``exp``, and a non-finite loss or gradient skips the optimizer step
    (:class:`~sb3_safe.common.updates.GuardedOptimizerStep`).

    Policy loss per minibatch: ``-mean(min(r A, clip(r, 1 - eps, 1 + eps) A)) + beta * mean(KL)``. After the
    update phase beta is adapted from the mean KL over the whole rollout (:func:`adapt_kl_beta`). ``kl_beta``
    is saved with the model and keeps adapting after ``load``.

    The squashed Gaussian's log-prob is a pure function of the stored squashed action, the probability of that
    action also at the limits (censored mass, no ``atanh`` of a saturated value), so the first ratio of each update
    is 1 without storing the pre-squash action.

    Accepts every argument of SB3's :sb3:`PPO <modules/ppo.html#stable_baselines3.ppo.PPO>`, with the same
    meaning; ``"MlpPolicy"``, ``"CnnPolicy"`` and ``"MultiInputPolicy"`` are the safe policies of
    :mod:`sb3_safe.common.policies`.

    Checkpoints load both ways: ``KLAdaptivePPO.load("ppo.zip")`` continues a run of SB3's PPO with the safe
    policy of the same kind and the KL rollout buffer (the penalty starting at ``initial_kl_beta``), and
    ``PPO.load("kl_ppo.zip")`` trains on as PPO (the buffer is not saved, each algorithm builds its own).

    :param policy: the policy: ``"MlpPolicy"``, ``"CnnPolicy"``, ``"MultiInputPolicy"`` (the safe policies) or a
        policy class
    :param env: the environment to learn from (an id registered in gymnasium, an env or a VecEnv)
    :param learning_rate: as in PPO: the learning rate, or a function of the progress remaining (from 1 to 0)
    :param n_steps: as in PPO: steps per environment per update (the rollout holds ``n_steps * n_envs``)
    :param batch_size: as in PPO: the minibatch size
    :param n_epochs: as in PPO: passes over the rollout per update
    :param gamma: as in PPO: the discount factor
    :param gae_lambda: as in PPO: the bias / variance trade-off of Generalized Advantage Estimation
    :param clip_range: as in PPO: the clipping parameter, or a function of the progress remaining; ``None`` for the
        paper's penalty-only variant (no clipping)
    :param clip_range_vf: as in PPO: the value function's clipping parameter (None: no clipping; it depends on the
        reward scale)
    :param normalize_advantage: as in PPO: whether to normalize the advantages
    :param ent_coef: as in PPO: the entropy coefficient of the loss
    :param vf_coef: as in PPO: the value function coefficient of the loss
    :param max_grad_norm: as in PPO: the largest gradient norm, beyond which gradients are clipped
    :param use_sde: as in PPO: generalized State Dependent Exploration (gSDE) instead of independent Gaussian noise
    :param sde_sample_freq: as in PPO: with gSDE, a new noise matrix every this many steps (-1: once per rollout)
    :param rollout_buffer_class: a :class:`~sb3_safe.common.buffers.KLRolloutBuffer` subclass (it keeps the old
        distribution parameters for the KL); None: chosen from the observation space
    :param rollout_buffer_kwargs: as in PPO: keyword arguments of the rollout buffer
    :param target_kl: as in PPO: stop an update's epochs early once the approximate KL exceeds this (None: never)
    :param adaptive_kl_target: d_targ, the KL the penalty coefficient is adapted towards
    :param initial_kl_beta: the penalty coefficient beta at the start, inside ``kl_beta_bounds``
    :param kl_beta_bounds: ``(lowest, highest)`` beta, positive and finite
    :param kl_adapt_tolerance: beta changes when the KL is outside ``[target / tol, target * tol]``; > 1
    :param kl_adapt_factor: beta is multiplied or divided by this; > 1
    :param adaptive_lr: :class:`~sb3_safe.KLAdaptiveLRCallback`'s keyword arguments (``{}`` for its defaults):
        every ``learn()`` then adapts the learning rate to the rollout KL with it; saved with the model. None: the
        configured learning rate
    :param normalize_value: regress the critic on returns normalized by their running mean and std, its last layer
        rescaled when they change so its values in reward units stay the same (PopArt,
        :mod:`sb3_safe.common.value_norm`): the value loss (then logged in normalized units) no longer grows with the
        reward scale. The statistics are saved with the model. ``"auto"`` (the default): on, unless the environment's
        rewards are normalized already (a ``VecNormalize(norm_reward=True)`` wrapper, where PopArt on top learned
        worse, measured on Acrobot-v1); decided when the model is set up, saved decided. ``clip_range_vf`` then acts
        in normalized units
    :param stats_window_size: as in PPO: the number of episodes the logged rollout statistics average over
    :param tensorboard_log: as in PPO: the TensorBoard log folder (None: no TensorBoard log)
    :param policy_kwargs: as in PPO: keyword arguments of the policy, the safe policies' ``log_std_range``,
        ``logit_bound`` and ``squash_output`` included; their ``normalize_observations`` is ``"auto"`` by default here:
        Box observations that are not images are normalized, unless the env's ``VecNormalize(norm_obs=True)`` does
    :param verbose: as in PPO: 0 no output, 1 information (device, wrappers), 2 debug messages
    :param seed: as in PPO: the seed of the random generators
    :param device: as in PPO: the torch device (``"auto"``: a GPU if there is one)
    """

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpPolicy": SafeActorCriticPolicy,
        "CnnPolicy": SafeCnnPolicy,
        "MultiInputPolicy": SafeMultiInputPolicy,
    }
    rollout_buffer: KLRolloutBuffer
    #: Restored with the state before an update (a rollback, an undo): an update that failed may have adapted beta to a
    #: diverged KL, and the skip counts describe the kept updates
    rollback_attributes: ClassVar[tuple[str, ...]] = ("kl_beta", "guarded_step")

    def __init__(
        self,
        policy: str | type[ActorCriticPolicy],
        env: GymEnv | str,
        learning_rate: float | Schedule = 3e-4,
        n_steps: int = 2048,
        batch_size: int = 64,
        n_epochs: int = 10,
        gamma: float = 0.99,
        gae_lambda: float = 0.95,
        clip_range: float | Schedule | None = 0.2,
        clip_range_vf: float | Schedule | None = None,
        normalize_advantage: bool = True,
        ent_coef: float = 0.0,
        vf_coef: float = 0.5,
        max_grad_norm: float = 0.5,
        use_sde: bool = False,
        sde_sample_freq: int = -1,
        rollout_buffer_class: type[RolloutBuffer] | None = None,
        rollout_buffer_kwargs: dict[str, Any] | None = None,
        target_kl: float | None = None,
        adaptive_kl_target: float = 0.01,
        initial_kl_beta: float = 1.0,
        kl_beta_bounds: tuple[float, float] = (1e-4, 1e3),
        kl_adapt_tolerance: float = 1.5,
        kl_adapt_factor: float = 2.0,
        adaptive_lr: dict[str, Any] | None = None,
        normalize_value: NormalizeValue = "auto",
        stats_window_size: int = 100,
        tensorboard_log: str | None = None,
        policy_kwargs: dict[str, Any] | None = None,
        verbose: int = 0,
        seed: int | None = None,
        device: th.device | str = "auto",
        _init_setup_model: bool = True,
    ):
        if rollout_buffer_class is not None and not issubclass(rollout_buffer_class, KLRolloutBuffer):
            raise ValueError(
                "rollout_buffer_class must subclass sb3_safe.common.buffers.KLRolloutBuffer (it keeps the old "
                f"distribution parameters for the KL), got {rollout_buffer_class.__name__}"
            )
        super().__init__(
            policy,
            env,
            learning_rate=learning_rate,
            n_steps=n_steps,
            batch_size=batch_size,
            n_epochs=n_epochs,
            gamma=gamma,
            gae_lambda=gae_lambda,
            # An infinite clip range makes the clipped surrogate the plain one: the paper's penalty-only variant
            clip_range=math.inf if clip_range is None else clip_range,
            clip_range_vf=clip_range_vf,
            normalize_advantage=normalize_advantage,
            ent_coef=ent_coef,
            vf_coef=vf_coef,
            max_grad_norm=max_grad_norm,
            use_sde=use_sde,
            sde_sample_freq=sde_sample_freq,
            rollout_buffer_class=rollout_buffer_class,
            rollout_buffer_kwargs=rollout_buffer_kwargs,
            target_kl=target_kl,
            stats_window_size=stats_window_size,
            tensorboard_log=tensorboard_log,
            policy_kwargs=policy_kwargs,
            verbose=verbose,
            seed=seed,
            device=device,
            _init_setup_model=False,
        )
        low, high = (float(bound) for bound in kl_beta_bounds)
        if not 0.0 < low <= high < math.inf:
            raise ValueError(f"kl_beta_bounds=(lowest, highest) needs 0 < lowest <= highest < inf, got {kl_beta_bounds!r}")
        if not low <= initial_kl_beta <= high:
            raise ValueError(f"initial_kl_beta must lie inside kl_beta_bounds={kl_beta_bounds!r}, got {initial_kl_beta!r}")
        if not 0.0 < adaptive_kl_target < math.inf:
            raise ValueError(f"adaptive_kl_target must be positive and finite, got {adaptive_kl_target!r}")
        if not 1.0 < kl_adapt_tolerance < math.inf:
            raise ValueError(f"kl_adapt_tolerance must be > 1 and finite, got {kl_adapt_tolerance!r}")
        if not 1.0 < kl_adapt_factor < math.inf:
            raise ValueError(f"kl_adapt_factor must be > 1 and finite, got {kl_adapt_factor!r}")
        self.adaptive_kl_target = float(adaptive_kl_target)
        self.kl_beta_bounds = (low, high)
        self.kl_adapt_tolerance = float(kl_adapt_tolerance)
        self.kl_adapt_factor = float(kl_adapt_factor)
        self.adaptive_lr = check_adaptive_lr(adaptive_lr)
        #: True, False or "auto" until _setup_model decides it (saved decided)
        self.normalize_value: NormalizeValue = check_normalize_value(normalize_value)
        #: the KL penalty coefficient beta, adapted after each update phase (saved with the model)
        self.kl_beta = float(initial_kl_beta)
        # Created here, not in _setup_model, so that load() restores its counters
        self.guarded_step = GuardedOptimizerStep("policy")

        if _init_setup_model:
            self._setup_model()

    @classmethod
    def load(
        cls: type[SelfKLAdaptivePPO],
        path: str | pathlib.Path | io.BufferedIOBase,
        env: GymEnv | None = None,
        device: th.device | str = "auto",
        custom_objects: dict[str, Any] | None = None,
        print_system_info: bool = False,
        force_reset: bool = True,
        **kwargs: Any,
    ) -> SelfKLAdaptivePPO:
        """
        SB3's ``load``; a checkpoint of SB3's PPO (or another algorithm with SB3's actor-critic policies) continues
        with the safe policy of the same kind (see :mod:`sb3_safe.common.checkpoints`). Like SB3's ``load`` it
        unpickles the file: for a file you did not write, :func:`sb3_safe.load` loads it without running its code.

        :param path: the saved model (``.zip`` may be left out), or a file-like object
        :param env: the environment to train on (None: set it later with ``set_env``, or only predict)
        :param device: the torch device (``"auto"``: a GPU if there is one)
        :param custom_objects: items of the saved ``data`` to use instead of the file's, never unpickled (e.g. a
            lambda learning rate)
        :param print_system_info: print the system information of the save and of this machine
        :param force_reset: reset the environment before training, as SB3 does to avoid unexpected behavior
        :param kwargs: attributes to set on the model, replacing saved ones (e.g. ``n_steps``)
        :return: the model
        """
        custom_objects = continue_stock_checkpoint(path, cls.policy_aliases, ("kl_beta",), custom_objects)
        # A checkpoint from before normalize_value (or a stock one) was trained with SB3's critic
        kwargs = with_settings_of_older_checkpoints(path, {"normalize_value": False}, kwargs)
        return super().load(path, env, device, custom_objects, print_system_info, force_reset, **kwargs)

    def _setup_model(self) -> None:
        self.policy_kwargs = decide_normalize_observations(self.policy_class, self.policy_kwargs, self.env, "auto")
        # load() restores the bounds from JSON as a list
        self.kl_beta_bounds = (float(self.kl_beta_bounds[0]), float(self.kl_beta_bounds[1]))
        if self.rollout_buffer_class in (None, RolloutBuffer, DictRolloutBuffer):
            # None: chosen here. SB3's own buffers: a PPO checkpoint (PPO saves the class it chose), continued here
            self.rollout_buffer_class = (
                KLDictRolloutBuffer if isinstance(self.observation_space, spaces.Dict) else KLRolloutBuffer
            )
        elif not issubclass(self.rollout_buffer_class, KLRolloutBuffer):
            raise ValueError(
                f"KLAdaptivePPO needs a KLRolloutBuffer (it keeps the old distribution parameters for the KL), and "
                f"this model has rollout_buffer_class={self.rollout_buffer_class.__name__} (a checkpoint of another "
                "algorithm?): build KLAdaptivePPO(...) and model.set_parameters(path) to take over its weights"
            )
        super()._setup_model()
        self.rollout_buffer.attach_policy(self.policy)
        warn_if_normalized_twice(self.policy, self.env)
        self.normalize_value = resolve_normalize_value(self.normalize_value, self.env)
        if self.normalize_value:
            install_value_normalization(self.policy)

    def _excluded_save_params(self) -> list[str]:
        excluded = super()._excluded_save_params()
        # The default buffer is not saved, so that PPO.load picks its own (KLAdaptivePPO.load picks this one again):
        # a KLRolloutBuffer in PPO's hands would never be attached to the policy
        if self.rollout_buffer_class in (KLRolloutBuffer, KLDictRolloutBuffer):
            excluded.append("rollout_buffer_class")
        return [*excluded, ADAPTIVE_LR_CALLBACK]

    #: Its schedules are read at progress 0 past the end of training (the supervisor of the callbacks need not)
    reads_schedules_from_zero: ClassVar[bool] = True

    def _update_current_progress_remaining(self, num_timesteps: int, total_timesteps: int) -> None:
        super()._update_current_progress_remaining(num_timesteps, total_timesteps)
        read_from_zero_past_the_end(self)

    def _mean_kl_to_old(
        self, rollout_data: KLRolloutBufferSamples | KLDictRolloutBufferSamples, log_prob: th.Tensor | None = None
    ) -> th.Tensor:
        """
        Mean KL(pi_old || pi) over the samples, for the distribution the last forward pass left in
        ``policy.action_dist``.

        :param log_prob: log-probabilities of the stored actions under it, if already computed (needed only
            without an analytic KL)
        """
        # SB3's distributions are stateful: evaluate_actions and get_distribution leave theirs in policy.action_dist
        distribution = self.policy.action_dist
        if has_analytic_kl(distribution):
            return analytic_kl(rollout_data.old_dist_params, distribution, reduction="batchmean")
        if log_prob is None:
            log_prob = distribution.log_prob(self._actions(rollout_data))
        return approx_kl(log_prob - rollout_data.old_log_prob).mean()

    @th.no_grad()
    def _rollout_kl(self) -> float:
        """Mean KL(pi_old || pi) over the whole rollout, for the beta rule."""
        with outside_rollouts(self.policy):  # a measurement, not a rollout: the observation statistics stay
            self.policy.set_training_mode(False)
        total, count = 0.0, 0
        # No gradients here, so larger batches than the minibatches: fewer passes; only the actor is evaluated
        for rollout_data in self.rollout_buffer.get(max(self.batch_size, _MEASURE_BATCH_SIZE)):
            self.policy.get_distribution(rollout_data.observations)
            n_samples = len(rollout_data.actions)
            total += self._mean_kl_to_old(rollout_data).item() * n_samples
            count += n_samples
        return total / count

    def _actions(self, rollout_data: KLRolloutBufferSamples | KLDictRolloutBufferSamples) -> th.Tensor:
        if isinstance(self.action_space, spaces.Discrete):
            return rollout_data.actions.long().flatten()
        return rollout_data.actions

    @property
    def skipped_updates(self) -> int:
        """Number of optimizer steps skipped because the loss or the gradient norm was not finite."""
        return self.guarded_step.n_skipped

    def train(self) -> None:
        """Update policy and value function on the rollout buffer, then adapt the KL coefficient."""
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        self.guarded_step.start_update()
        head = value_head(self.policy)
        if head is not None:
            # Once per update, on the whole rollout: every minibatch regresses on the same scale
            head.update(self.rollout_buffer.returns)
        clip_range = self.clip_range(self._current_progress_remaining)  # type: ignore[operator]
        clip_range_vf = None if self.clip_range_vf is None else self.clip_range_vf(self._current_progress_remaining)  # type: ignore[operator]
        # One row of statistics per minibatch, kept as tensors: one host sync per update phase, not seven per minibatch
        minibatch_stats: list[th.Tensor] = []

        # The rollout's observations, value targets and advantages normalized once for all minibatches and epochs
        with NormalizedRollout(self.policy, self.rollout_buffer) as normalized:
            last_epoch_start, loss = self._train_epochs(clip_range, clip_range_vf, normalized, minibatch_stats)
            self.guarded_step.name_an_update_without_steps(type(self).__name__)
            rollout_kl = self._rollout_kl()
        self.kl_beta = adapt_kl_beta(
            self.kl_beta,
            rollout_kl,
            self.adaptive_kl_target,
            self.kl_adapt_tolerance,
            self.kl_adapt_factor,
            self.kl_beta_bounds,
        )

        explained_var = explained_variance_float64(self.rollout_buffer.values, self.rollout_buffer.returns)
        stats = th.stack(minibatch_stats).cpu().numpy()
        pg_loss, kl_penalty_mean, value_loss_mean, entropy_loss_mean, _, clip_fraction_mean, clamped_mean = stats.mean(0)
        self.logger.record("train/entropy_loss", float(entropy_loss_mean))
        self.logger.record("train/policy_gradient_loss", float(pg_loss))
        self.logger.record("train/kl_penalty", float(kl_penalty_mean))
        self.logger.record("train/value_loss", float(value_loss_mean))
        self.logger.record("train/approx_kl", float(stats[last_epoch_start:, 4].mean()))
        self.logger.record("train/clip_fraction", float(clip_fraction_mean))
        self.logger.record("train/log_ratio_clamped_fraction", float(clamped_mean))
        self.logger.record("train/loss", loss.item())
        self.logger.record("train/explained_variance", explained_var)
        self.logger.record("train/kl", rollout_kl)
        self.logger.record("train/kl_beta", self.kl_beta)
        self.logger.record("train/skipped_updates", self.skipped_updates)
        if hasattr(self.policy, "log_std"):
            self.logger.record("train/std", th.exp(self.policy.log_std).mean().item())
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/clip_range", clip_range)
        if clip_range_vf is not None:
            self.logger.record("train/clip_range_vf", clip_range_vf)
        if head is not None:
            record_value_statistics(self, head)

    def _train_epochs(
        self,
        clip_range: float,
        clip_range_vf: float | None,
        normalized: NormalizedRollout,
        minibatch_stats: list[th.Tensor],
    ) -> tuple[int, th.Tensor]:
        """
        The update's epochs of minibatch steps, on the rollout in the losses' units (``normalized``).

        :param minibatch_stats: a row of statistics is appended per minibatch
        :return: where the last epoch's rows start (SB3 logs the approximate KL of the last epoch only), and the last
            minibatch's loss
        """
        last_epoch_start = 0
        loss = th.tensor(math.nan)
        continue_training = True
        for epoch in range(self.n_epochs):
            last_epoch_start = len(minibatch_stats)
            for rollout_data in self.rollout_buffer.get(self.batch_size):
                actions = self._actions(rollout_data)
                values, log_prob, entropy = self.policy.evaluate_actions(rollout_data.observations, actions)
                values = values.flatten()
                # In normalized units where the values are (PopArt): the buffer's returns, old values and advantages too
                returns, old_values, advantages = rollout_data.returns, rollout_data.old_values, rollout_data.advantages
                if self.normalize_advantage:
                    advantages = normalize_advantages(advantages)

                raw_log_ratio = log_prob - rollout_data.old_log_prob
                # Clamped before exp: even a diverged log-prob cannot overflow the ratio
                log_ratio = clamp_log_ratio(raw_log_ratio)
                ratio = th.exp(log_ratio)
                mean_kl = self._mean_kl_to_old(rollout_data, log_prob)

                # Clipped surrogate (paper eq. 7) + adaptive KL penalty (sec. 4) + value and entropy terms (eq. 9)
                surrogate = th.min(advantages * ratio, advantages * th.clamp(ratio, 1 - clip_range, 1 + clip_range))
                policy_loss = -surrogate.mean()
                kl_penalty = self.kl_beta * mean_kl
                if clip_range_vf is not None:
                    values = old_values + th.clamp(values - old_values, -clip_range_vf, clip_range_vf)
                value_loss = F.mse_loss(returns, values)
                # No entropy (gSDE with squashing): -log_prob estimates it, as in SB3
                entropy_loss = -th.mean(entropy) if entropy is not None else th.mean(log_prob)
                loss = policy_loss + kl_penalty + self.ent_coef * entropy_loss + self.vf_coef * value_loss

                with th.no_grad():
                    # SB3's estimate of the KL, from the ratio already computed (approx_kl without its expm1)
                    approx_kl_div = ((ratio - 1) - log_ratio).mean()
                    clip_fraction = (th.abs(ratio - 1) > clip_range).float().mean()
                    clamped_fraction = (log_ratio != raw_log_ratio).float().mean()
                    row = (policy_loss, kl_penalty, value_loss, entropy_loss, approx_kl_div, clip_fraction, clamped_fraction)
                    minibatch_stats.append(th.stack(row))

                # SB3's early stopping on the (estimated) KL of this minibatch
                if self.target_kl is not None and approx_kl_div.item() > 1.5 * self.target_kl:
                    continue_training = False
                    if self.verbose >= 1:
                        print(f"Early stopping at step {epoch} due to reaching max kl: {approx_kl_div.item():.2f}")
                    break

                self.guarded_step(self.policy.optimizer, loss, self.policy.parameters(), self.max_grad_norm)
                # A rollback of the guard in this step restored the statistics: the next minibatch is normalized anew
                normalized.refresh()

            self._n_updates += 1
            if not continue_training:
                break
        return last_epoch_start, loss

    def learn(
        self: SelfKLAdaptivePPO,
        total_timesteps: int,
        callback: MaybeCallback = None,
        log_interval: int = 1,
        tb_log_name: str = "KLAdaptivePPO",
        reset_num_timesteps: bool = True,
        progress_bar: bool = False,
    ) -> SelfKLAdaptivePPO:
        super().learn(
            total_timesteps=total_timesteps,
            callback=with_adaptive_lr(self, callback),
            log_interval=log_interval,
            tb_log_name=tb_log_name,
            reset_num_timesteps=reset_num_timesteps,
            progress_bar=progress_bar,
        )
        write_last_update_statistics(self, log_interval)
        return self
