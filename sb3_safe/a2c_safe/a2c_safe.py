"""SafeA2C: SB3's A2C with safe action distributions and guarded updates."""

import io
import pathlib
from typing import Any, ClassVar, Literal, TypeVar

import torch as th
from gymnasium import spaces
from stable_baselines3 import A2C
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.policies import ActorCriticPolicy, BasePolicy
from stable_baselines3.common.sb2_compat.rmsprop_tf_like import RMSpropTFLike
from stable_baselines3.common.type_aliases import GymEnv, MaybeCallback, Schedule
from torch.nn import functional as F

from sb3_safe.a2c_safe.policies import CnnPolicy, MlpPolicy, MultiInputPolicy
from sb3_safe.common.adaptive_lr import ADAPTIVE_LR_CALLBACK, check_adaptive_lr, with_adaptive_lr
from sb3_safe.common.checkpoints import continue_stock_checkpoint, with_settings_of_older_checkpoints
from sb3_safe.common.observation_norm import decide_normalize_observations, warn_if_normalized_twice
from sb3_safe.common.policies import SafeActorCriticPolicy
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
    normalized_values,
    record_value_statistics,
    resolve_normalize_value,
    value_head,
)

SelfSafeA2C = TypeVar("SelfSafeA2C", bound="SafeA2C")

VALUE_LOSSES = ("mse", "huber")


class SafeA2C(A2C):
    """
    Advantage Actor Critic (A2C) that stays finite: safe action distributions and guarded updates.

    Same algorithm and arguments as SB3's :sb3:`A2C <modules/a2c.html#stable_baselines3.a2c.A2C>`; the
    differences:

    - ``"MlpPolicy"``, ``"CnnPolicy"`` and ``"MultiInputPolicy"`` are sb3-safe's policies: bounded logits
      (every action keeps a known minimum probability) for discrete actions, bounded log-std for Box actions.
      SB3's policy classes are still accepted. ``SafeA2C.load("a2c.zip")`` continues a run of SB3's A2C with the
      safe policy of the same kind (the weights and the optimizer state load as they are); ``A2C.load`` reads
      SafeA2C's checkpoints.
    - The optimizer step is skipped, leaving parameters and optimizer state untouched, when the loss or the
      gradient norm is not finite (logged as ``train/skipped_updates``, a running total).
    - Advantage normalization is safe for a batch of one and for zero variance.
    - ``value_loss="huber"`` keeps the value loss finite, and its gradient bounded, for returns far beyond the
      ~2e19 at which the default MSE (SB3's) overflows float32 (such steps are then skipped).
    - ``normalize_value`` (on unless the rewards are normalized by ``VecNormalize`` already) regresses the critic on
      normalized returns (PopArt): the value loss no longer grows with the reward scale.
    - ``train/logit_max`` (largest |raw logit| of the update, before the bound) for discrete actions, or
      ``train/log_std_min`` / ``train/log_std_max`` (of the log-std in use) for Box actions.

    :param policy: The policy model to use (MlpPolicy, CnnPolicy, ...)
    :param env: The environment to learn from (if registered in Gym, can be str)
    :param learning_rate: The learning rate, it can be a function
        of the current progress remaining (from 1 to 0)
    :param n_steps: The number of steps to run for each environment per update
        (i.e. batch size is n_steps * n_env where n_env is number of environment copies running in parallel)
    :param gamma: Discount factor
    :param gae_lambda: Factor for trade-off of bias vs variance for Generalized Advantage Estimator.
        Equivalent to classic advantage when set to 1.
    :param ent_coef: Entropy coefficient for the loss calculation
    :param vf_coef: Value function coefficient for the loss calculation
    :param max_grad_norm: The maximum value for the gradient clipping
    :param rms_prop_eps: RMSProp epsilon. It stabilizes square root computation in denominator
        of RMSProp update
    :param use_rms_prop: Whether to use RMSprop (default) or Adam as optimizer
    :param use_rms_prop_tf_like: Use SB3's TensorFlow-style ``RMSpropTFLike`` (epsilon inside the square root,
        squared-gradient average started at one), as the original A2C and rl-zoo's Atari setting do. Same as
        ``policy_kwargs=dict(optimizer_class=RMSpropTFLike, optimizer_kwargs=dict(alpha=0.99, eps=rms_prop_eps,
        weight_decay=0))``; needs ``use_rms_prop=True`` and no ``optimizer_class`` in ``policy_kwargs``.
    :param value_loss: ``"mse"`` (SB3's A2C) or ``"huber"`` (smooth L1 with delta 1: quadratic for errors
        below 1, linear above, so its gradient is bounded whatever the scale of the returns)
    :param adaptive_lr: :class:`~sb3_safe.KLAdaptiveLRCallback`'s keyword arguments (``{}`` for its defaults):
        every ``learn()`` then adapts the learning rate to the rollout KL with it; saved with the model. None: the
        configured learning rate
    :param normalize_value: regress the critic on returns normalized by their running mean and std, its last layer
        rescaled when they change so its values in reward units stay the same (PopArt,
        :mod:`sb3_safe.common.value_norm`): the value loss (then logged in normalized units) no longer grows with the
        reward scale. The statistics are saved with the model. ``"auto"`` (the default): on, unless the environment's
        rewards are normalized already (a ``VecNormalize(norm_reward=True)`` wrapper, where PopArt on top learned
        worse, measured on Acrobot-v1); decided when the model is set up, saved decided
    :param use_sde: Whether to use generalized State Dependent Exploration (gSDE)
        instead of action noise exploration (default: False)
    :param sde_sample_freq: Sample a new noise matrix every n steps when using gSDE
        Default: -1 (only sample at the beginning of the rollout)
    :param rollout_buffer_class: Rollout buffer class to use. If ``None``, it will be automatically selected.
    :param rollout_buffer_kwargs: Keyword arguments to pass to the rollout buffer on creation.
    :param normalize_advantage: Whether to normalize or not the advantage
    :param stats_window_size: Window size for the rollout logging, specifying the number of episodes to average
        the reported success rate, mean episode length, and mean reward over
    :param tensorboard_log: the log location for tensorboard (if None, no logging)
    :param policy_kwargs: additional arguments to be passed to the policy on creation
        (e.g. ``logit_bound``, ``log_std_range``, ``squash_output`` of the safe policies; their
        ``normalize_observations`` is ``False`` by default here, as in the drop-in policies: ``"auto"`` normalizes Box
        observations that are not images unless the env's ``VecNormalize(norm_obs=True)`` does)
    :param verbose: Verbosity level: 0 for no output, 1 for info messages (such as device or wrappers used), 2 for
        debug messages
    :param seed: Seed for the pseudo random generators
    :param device: Device (cpu, cuda, ...) on which the code should be run.
        Setting it to auto, the code will be run on the GPU if possible.
    :param _init_setup_model: Whether or not to build the network at the creation of the instance
    """

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpPolicy": MlpPolicy,
        "CnnPolicy": CnnPolicy,
        "MultiInputPolicy": MultiInputPolicy,
    }
    #: Restored with the state before an update (a rollback, an undo): the skip counts describe the kept updates
    rollback_attributes: ClassVar[tuple[str, ...]] = ("guarded_step",)

    def __init__(
        self,
        policy: str | type[ActorCriticPolicy],
        env: GymEnv | str,
        learning_rate: float | Schedule = 7e-4,
        n_steps: int = 5,
        gamma: float = 0.99,
        gae_lambda: float = 1.0,
        ent_coef: float = 0.0,
        vf_coef: float = 0.5,
        max_grad_norm: float = 0.5,
        rms_prop_eps: float = 1e-5,
        use_rms_prop: bool = True,
        use_rms_prop_tf_like: bool = False,
        value_loss: Literal["mse", "huber"] = "mse",
        adaptive_lr: dict[str, Any] | None = None,
        normalize_value: NormalizeValue = "auto",
        use_sde: bool = False,
        sde_sample_freq: int = -1,
        rollout_buffer_class: type[RolloutBuffer] | None = None,
        rollout_buffer_kwargs: dict[str, Any] | None = None,
        normalize_advantage: bool = False,
        stats_window_size: int = 100,
        tensorboard_log: str | None = None,
        policy_kwargs: dict[str, Any] | None = None,
        verbose: int = 0,
        seed: int | None = None,
        device: th.device | str = "auto",
        _init_setup_model: bool = True,
    ):
        if value_loss not in VALUE_LOSSES:
            raise ValueError(f"value_loss must be one of {VALUE_LOSSES}, got {value_loss!r}")
        policy_kwargs = dict(policy_kwargs or {})
        if use_rms_prop_tf_like:
            if not use_rms_prop:
                raise ValueError("use_rms_prop_tf_like=True needs use_rms_prop=True")
            if "optimizer_class" in policy_kwargs:
                raise ValueError("use_rms_prop_tf_like=True conflicts with optimizer_class in policy_kwargs")
            # Set here, A2C then keeps it: it only fills in an optimizer when policy_kwargs has none.
            # Being part of policy_kwargs, it is saved with the model.
            policy_kwargs.update(
                optimizer_class=RMSpropTFLike, optimizer_kwargs=dict(alpha=0.99, eps=rms_prop_eps, weight_decay=0)
            )
        self.use_rms_prop_tf_like = use_rms_prop_tf_like
        self.value_loss = value_loss
        self.adaptive_lr = check_adaptive_lr(adaptive_lr)
        #: True, False or "auto" until _setup_model decides it (saved decided)
        self.normalize_value: NormalizeValue = check_normalize_value(normalize_value)
        # Created before A2C's constructor and saved with the model, so the skip count survives save/load
        self.guarded_step = GuardedOptimizerStep()
        super().__init__(
            policy,
            env,
            learning_rate=learning_rate,
            n_steps=n_steps,
            gamma=gamma,
            gae_lambda=gae_lambda,
            ent_coef=ent_coef,
            vf_coef=vf_coef,
            max_grad_norm=max_grad_norm,
            rms_prop_eps=rms_prop_eps,
            use_rms_prop=use_rms_prop,
            use_sde=use_sde,
            sde_sample_freq=sde_sample_freq,
            rollout_buffer_class=rollout_buffer_class,
            rollout_buffer_kwargs=rollout_buffer_kwargs,
            normalize_advantage=normalize_advantage,
            stats_window_size=stats_window_size,
            tensorboard_log=tensorboard_log,
            policy_kwargs=policy_kwargs,
            verbose=verbose,
            seed=seed,
            device=device,
            _init_setup_model=_init_setup_model,
        )

    @classmethod
    def load(
        cls: type[SelfSafeA2C],
        path: str | pathlib.Path | io.BufferedIOBase,
        env: GymEnv | None = None,
        device: th.device | str = "auto",
        custom_objects: dict[str, Any] | None = None,
        print_system_info: bool = False,
        force_reset: bool = True,
        **kwargs: Any,
    ) -> SelfSafeA2C:
        """
        SB3's ``load``; a checkpoint of SB3's A2C (or another algorithm with SB3's actor-critic policies) continues
        with the safe policy of the same kind (see :mod:`sb3_safe.common.checkpoints`). A SafeA2C checkpoint keeps
        its policy, a stock one included. Like SB3's ``load`` it unpickles the file: for a file you did not write,
        :func:`sb3_safe.load` loads it without running its code.

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
        custom_objects = continue_stock_checkpoint(path, cls.policy_aliases, ("value_loss",), custom_objects)
        # A checkpoint from before normalize_value (or a stock one) was trained with SB3's critic
        kwargs = with_settings_of_older_checkpoints(path, {"normalize_value": False}, kwargs)
        return super().load(path, env, device, custom_objects, print_system_info, force_reset, **kwargs)

    def _setup_model(self) -> None:
        # Off unless asked for: on A2C's updates of a few steps, the per-step normalization costs several percent of the
        # time of a small network (benchmarks/results/overhead.md), where PPO's long rollouts hide it
        self.policy_kwargs = decide_normalize_observations(self.policy_class, self.policy_kwargs, self.env, False)
        super()._setup_model()
        warn_if_normalized_twice(self.policy, self.env)
        self.normalize_value = resolve_normalize_value(self.normalize_value, self.env)
        if self.normalize_value:
            install_value_normalization(self.policy)

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), ADAPTIVE_LR_CALLBACK]

    #: Its schedules are read at progress 0 past the end of training (the supervisor of the callbacks need not)
    reads_schedules_from_zero: ClassVar[bool] = True

    def _update_current_progress_remaining(self, num_timesteps: int, total_timesteps: int) -> None:
        super()._update_current_progress_remaining(num_timesteps, total_timesteps)
        read_from_zero_past_the_end(self)

    @property
    def skipped_updates(self) -> int:
        """Number of updates skipped because the loss or the gradient norm was not finite."""
        return self.guarded_step.n_skipped

    def train(self) -> None:
        """
        Update policy using the currently gathered rollout buffer (one gradient step over whole data),
        skipping the step if the loss or the gradient norm is not finite.
        """
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)

        head = value_head(self.policy)
        if head is not None:
            head.update(self.rollout_buffer.returns)
        # A2C takes one step on the whole rollout
        rollout_data = next(self.rollout_buffer.get(batch_size=None))
        actions = rollout_data.actions
        if isinstance(self.action_space, spaces.Discrete):
            actions = actions.long().flatten()

        # The raw action-net output: logits before the safe bound (or Gaussian means)
        raw_outputs: list[th.Tensor] = []
        hook = self.policy.action_net.register_forward_hook(lambda _net, _input, output: raw_outputs.append(output.detach()))
        try:
            with normalized_values(self.policy):
                values, log_prob, entropy = self.policy.evaluate_actions(rollout_data.observations, actions)
        finally:
            hook.remove()
        values = values.flatten()
        returns = rollout_data.returns if head is None else head.normalize(rollout_data.returns)

        advantages = rollout_data.advantages if head is None else head.scale_advantages(rollout_data.advantages)
        if self.normalize_advantage:
            advantages = normalize_advantages(advantages)

        policy_loss = -(advantages * log_prob).mean()
        value_loss = F.smooth_l1_loss(values, returns) if self.value_loss == "huber" else F.mse_loss(values, returns)
        # Without an analytical entropy, -log_prob estimates it
        entropy_loss = -th.mean(-log_prob) if entropy is None else -th.mean(entropy)
        loss = policy_loss + self.ent_coef * entropy_loss + self.vf_coef * value_loss

        self.guarded_step.start_update()
        self.guarded_step(self.policy.optimizer, loss, self.policy.parameters(), self.max_grad_norm)
        self.guarded_step.name_an_update_without_steps(type(self).__name__)

        explained_var = explained_variance_float64(self.rollout_buffer.values, self.rollout_buffer.returns)

        self._n_updates += 1
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/explained_variance", explained_var)
        self.logger.record("train/entropy_loss", entropy_loss.item())
        self.logger.record("train/policy_loss", policy_loss.item())
        self.logger.record("train/value_loss", value_loss.item())
        self.logger.record("train/skipped_updates", self.skipped_updates)
        if head is not None:
            record_value_statistics(self, head)
        if isinstance(self.action_space, spaces.Box):
            self._record_log_std()
        else:
            self.logger.record("train/logit_max", raw_outputs[0].abs().amax().item())

    def _record_log_std(self) -> None:
        """Log the range of the log-std in use (clamped to ``log_std_range`` by the safe policies)."""
        log_std = self.policy.log_std.detach()
        if isinstance(self.policy, SafeActorCriticPolicy):
            log_std = log_std.clamp(*self.policy.log_std_range)
        self.logger.record("train/log_std_min", log_std.min().item())
        self.logger.record("train/log_std_max", log_std.max().item())
        self.logger.record("train/std", log_std.exp().mean().item())

    def learn(
        self: SelfSafeA2C,
        total_timesteps: int,
        callback: MaybeCallback = None,
        log_interval: int = 100,
        tb_log_name: str = "SafeA2C",
        reset_num_timesteps: bool = True,
        progress_bar: bool = False,
    ) -> SelfSafeA2C:
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
