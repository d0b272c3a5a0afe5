"""Drop-in SB3 actor-critic policies whose action distributions stay finite and valid."""

import contextlib
import inspect
import warnings
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.policies import (
    ActorCriticCnnPolicy,
    ActorCriticPolicy,
    BasePolicy,
    MultiInputActorCriticPolicy,
)
from stable_baselines3.common.torch_layers import CombinedExtractor, NatureCNN
from stable_baselines3.common.type_aliases import Schedule

from sb3_safe.common.distributions import (
    DEFAULT_LOG_STD_RANGE,
    DEFAULT_LOGIT_BOUND,
    make_safe_distribution,
    validate_log_std_range,
    validate_logit_bound,
)
from sb3_safe.common.numerics import NonFiniteError
from sb3_safe.common.observation_norm import (
    NormalizeObservations,
    ObservationNormalizer,
    validate_normalize_observations,
)
from sb3_safe.common.value_norm import install_saved_value_normalization

#: What the algorithms of other policy families read from their policy right after building it (in
#: ``_setup_model``), and which algorithms read it
_OTHER_FAMILIES_ATTRIBUTES = {
    "actor": "SAC, TD3, DDPG, TQC or CrossQ",
    "actor_target": "TD3 or DDPG",
    "critic": "SAC, TD3, DDPG, TQC or CrossQ",
    "critic_target": "SAC, TD3, DDPG or TQC",
    "q_net": "DQN",
    "q_net_target": "DQN",
    "quantile_net": "QRDQN",
    "quantile_net_target": "QRDQN",
    "lstm_actor": "RecurrentPPO",
}


class PolicyAlgorithmMismatchError(TypeError, AttributeError):
    """
    A safe policy given to an algorithm it cannot serve. A ``TypeError`` (the wrong policy type for the algorithm);
    also an ``AttributeError``, raised where the algorithm reads an attribute the policy lacks, so that ``hasattr``
    and ``getattr(policy, name, default)`` keep their meaning.
    """


class SafeDistributionMixin(BasePolicy):
    """
    What makes an SB3 / sb3-contrib policy family numerically safe, shared by all of sb3-safe's policies
    (actor-critic, recurrent, maskable). List it first in the bases, before the SB3 policy it makes safe:
    ``class SafeX(SafeDistributionMixin, X)``. The family class provides:

    - a constructor that calls :meth:`_init_safe_arguments` before SB3's constructor (whose ``_build`` needs them);
    - :meth:`_set_safe_action_dist`, which sets the safe action distribution;
    - :attr:`safe_keywords`, its constructor keywords beyond those of ``X``.

    The mixin gives, whatever the family:

    - ``_build``: the safe distribution replaces SB3's before the networks are built on it, and the optimizer is
      built with ``foreach=True`` where the caller chose no implementation (:func:`prefer_foreach`);
    - :attr:`optimizer`: every optimizer assigned to the policy (SB3's, the one sb3-contrib's recurrent policy
      rebuilds in its constructor, a user's) projects the log-std parameter after each of its steps;
    - :meth:`project_log_std`, also run by ``get_distribution`` (whatever its signature) and ``set_training_mode``;
    - ``_get_constructor_parameters`` saving :attr:`safe_keywords`, so ``save`` / ``load`` restore them;
    - with ``normalize_observations``, :attr:`observation_normalizer` before every features extractor, its statistics
      taken from the observations of the rollouts (see :meth:`set_training_mode`), never from ``forward`` calls
      outside one, ``predict``, evaluation or export; ``load_state_dict`` installs it for a state dict that has its
      statistics, and a strict load of a state dict without them removes the one ``"auto"`` installed (a checkpoint
      of a stock policy loads as it was trained).
    """

    #: Constructor keywords the family adds to its SB3 policy's, saved with the policy (read back as attributes)
    safe_keywords: ClassVar[tuple[str, ...]] = ("log_std_range", "logit_bound", "squash_output", "normalize_observations")
    #: The algorithms the family serves, for the error when another algorithm is given the policy
    served_algorithms: ClassVar[str] = "PPO, A2C, KLAdaptivePPO, SafeA2C and TRPO"

    log_std_range: tuple[float, float]
    logit_bound: float | None
    _tanh_squash: bool
    normalize_observations: bool
    #: the ``normalize_observations`` argument (``"auto"`` gives way to a checkpoint without statistics)
    _normalize_observations_setting: NormalizeObservations
    #: whether a rollout is being collected: its ``forward`` calls keep their observations for the statistics
    _collecting_observations: bool
    #: whether evaluation-mode work that is not a rollout runs (:meth:`outside_rollouts`)
    _outside_rollouts: bool

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails (torch's Module.__getattr__ then finds submodules and parameters).
        # SB3 algorithms cannot be told apart by the arguments they build their policy with (SAC passes use_sde,
        # as PPO does; RecurrentPPO passes exactly PPO's), but each family's algorithm reads its own parts of the
        # policy right after building it: SAC policy.actor, DQN policy.q_net, RecurrentPPO policy.lstm_actor.
        # Module.__getattr__ is the next one in the MRO; called directly, as this runs at every submodule access
        if name not in _OTHER_FAMILIES_ATTRIBUTES:
            return th.nn.Module.__getattr__(self, name)
        try:
            return th.nn.Module.__getattr__(self, name)
        except AttributeError:
            pass
        raise PolicyAlgorithmMismatchError(
            f"{type(self).__name__} serves {self.served_algorithms}, not {_OTHER_FAMILIES_ATTRIBUTES[name]} "
            f'(which read policy.{name}): give that algorithm its own policy, e.g. "MlpPolicy"'
        )

    def _init_safe_arguments(
        self,
        action_space: spaces.Space,
        log_std_range: tuple[float, float] = DEFAULT_LOG_STD_RANGE,
        logit_bound: float | None = DEFAULT_LOGIT_BOUND,
        squash_output: bool = False,
        use_sde: bool = False,
        observation_space: spaces.Space | None = None,
        normalize_observations: NormalizeObservations = False,
    ) -> bool:
        """
        Check and store the safe keywords. Called before SB3's constructor, whose ``_build`` builds the
        distribution from them (plain attributes can be set on a torch module before ``Module.__init__``).

        :param action_space: the policy's action space
        :param log_std_range: see :class:`SafeActorCriticPolicy`
        :param logit_bound: see :class:`SafeActorCriticPolicy`
        :param squash_output: see :class:`SafeActorCriticPolicy`
        :param use_sde: whether gSDE is used
        :param observation_space: the policy's observation space (checked where ``normalize_observations``)
        :param normalize_observations: see :class:`SafeActorCriticPolicy`
        :return: the ``squash_output`` to pass to SB3's constructor: SB3 squashes only with gSDE, without it the
            squashed Gaussian is sb3-safe's
        :raises ValueError: naming the argument, for a setting outside its allowed values
        """
        if squash_output:
            if not isinstance(action_space, spaces.Box):
                raise ValueError(f"squash_output=True needs a Box action space, got {action_space}")
            if not (np.all(np.isfinite(action_space.low)) and np.all(np.isfinite(action_space.high))):
                raise ValueError(f"squash_output=True needs finite Box bounds to rescale to, got {action_space}")
        self.log_std_range = validate_log_std_range(log_std_range)
        self.logit_bound = validate_logit_bound(logit_bound)
        warn_about_arguments_without_effect(action_space, self.log_std_range, self.logit_bound)
        self._tanh_squash = squash_output and not use_sde
        self.normalize_observations = validate_normalize_observations(normalize_observations, observation_space)
        self._normalize_observations_setting = normalize_observations
        self._collecting_observations = False
        self._outside_rollouts = False
        return squash_output and use_sde

    def _set_safe_action_dist(self) -> None:
        """Set ``action_dist`` to the family's safe distribution, from the arguments :meth:`_init_safe_arguments` stored."""
        raise NotImplementedError

    def _build(self, lr_schedule: Schedule) -> None:
        self.optimizer_kwargs = prefer_foreach(self.optimizer_class, self.optimizer_kwargs)
        # SB3's constructors set their own distribution just before calling _build, which builds the networks on it
        self._set_safe_action_dist()
        super()._build(lr_schedule)  # type: ignore[misc]  # the SB3 policy next in the MRO has it
        if self.normalize_observations:
            self._install_observation_normalizer()

    def _install_observation_normalizer(self) -> None:
        # A pre-hook of each features extractor, not an override of extract_features: SB3's policies reach the
        # extractors through BaseModel.extract_features directly (predict_values, get_distribution)
        shape = self.observation_space.shape
        assert shape is not None  # a Box: _init_safe_arguments checked it
        self.observation_normalizer = ObservationNormalizer(shape).to(self.device)
        extractors = {
            id(module): module
            for name in ("features_extractor", "pi_features_extractor", "vf_features_extractor")
            if isinstance(module := getattr(self, name, None), th.nn.Module)
        }
        self._observation_hooks = [
            extractor.register_forward_pre_hook(self.observation_normalizer.features_extractor_pre_hook)
            for extractor in extractors.values()
        ]
        self.normalize_observations = True

    def _remove_observation_normalizer(self) -> None:
        for hook in self._observation_hooks:
            hook.remove()
        del self.observation_normalizer
        self.normalize_observations = False

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any:
        """
        ``th.nn.Module.load_state_dict``; the observation normalizer follows the state dict: installed for one that
        has its statistics (a model trained with it predicts only with it); removed by a strict load of one without,
        if ``"auto"`` installed it (a checkpoint of a stock policy loads as it was trained). A partial load
        (``strict=False``) of a state dict without its statistics keeps the normalizer and its statistics.

        :param state_dict: the parameters and buffers to load
        :param strict: whether the keys must match this module's exactly
        :param assign: whether to assign the loaded tensors instead of copying into the existing ones
        :return: the missing and unexpected keys
        """
        saved = any(key.startswith("observation_normalizer.") for key in state_dict)
        if saved and not self.normalize_observations:
            self._install_observation_normalizer()
        elif strict and not saved and self.normalize_observations and self._normalize_observations_setting == "auto":
            self._remove_observation_normalizer()
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def forward(self, obs: th.Tensor, *args: Any, **kwargs: Any) -> Any:
        # forward() is how the on-policy algorithms act in a rollout (predict() and the updates do not call it)
        if self.normalize_observations and self._collecting_observations:
            normalizer = self.observation_normalizer
            if normalizer.commit_due:
                # The rollout's first step: the statistics take in the rollouts already trained on. Not at the switch
                # to evaluation mode: what runs between it and this step (callbacks at the rollout's start: the
                # adaptive lr's measurement of the last update, the guard's snapshot) sees the update's statistics
                normalizer.commit()
                normalizer.commit_due = False
            normalizer.observe(obs)
        return super().forward(obs, *args, **kwargs)

    def predict_values(self, *args: Any, **kwargs: Any) -> th.Tensor:
        # A rollout ends with the values of its last observations (and bootstraps truncated episodes with them): its
        # observations join the pending statistics before a callback's snapshot at its end copies them
        if self.normalize_observations and self._collecting_observations:
            self._fold_rollout()
        return super().predict_values(*args, **kwargs)  # type: ignore[misc]  # the SB3 policy next in the MRO has it

    def predict(self, *args: Any, **kwargs: Any) -> Any:
        # Signatures differ between the families (maskable: action_masks). Its switch to evaluation mode starts no
        # rollout: predict() never changes the observation statistics
        with self.outside_rollouts():
            return super().predict(*args, **kwargs)

    @contextlib.contextmanager
    def outside_rollouts(self) -> Iterator[None]:
        """
        A context for evaluation-mode work that is not a rollout (``predict``, a measurement after an update): its
        ``set_training_mode(False)`` starts no rollout, so the observation statistics stay as they are.
        """
        normalizer = self.observation_normalizer if self.normalize_observations else None
        previous, self._outside_rollouts = self._outside_rollouts, True
        observing = normalizer is not None and normalizer.observing
        if normalizer is not None:
            normalizer.observing = False  # what it normalizes is not observed: a non-finite value passes as NaN
        try:
            yield
        finally:
            self._outside_rollouts = previous
            if normalizer is not None:
                normalizer.observing = observing

    @property
    def optimizer(self) -> th.optim.Optimizer:
        """
        The policy's optimizer. Any optimizer assigned here (SB3 builds one in ``_build``, sb3-contrib's recurrent
        policy and user code may replace it) projects the log-std parameter after each of its steps.
        """
        return self._optimizer

    @optimizer.setter
    def optimizer(self, optimizer: th.optim.Optimizer) -> None:
        self._optimizer = optimizer
        if isinstance(getattr(self, "log_std", None), th.nn.Parameter):
            optimizer.register_step_post_hook(self._project_after_step)

    def project_log_std(self) -> None:
        """
        Clamp the log-std parameter into ``log_std_range``, where the clamp in the distribution passes its gradient
        (outside, it would be a dead zone with zero gradient). Policies without one (discrete actions) have nothing
        to project.

        Runs after every step of :attr:`optimizer`, before each distribution ``get_distribution`` builds (sb3-contrib
        TRPO's line search sets the parameters and then calls it), and at each ``set_training_mode`` (the start
        of every rollout and update phase, whatever changed the parameters in between).
        """
        log_std = getattr(self, "log_std", None)
        if isinstance(log_std, th.nn.Parameter):
            with th.no_grad():
                log_std.clamp_(*self.log_std_range)

    def _project_after_step(self, optimizer: th.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.project_log_std()

    def get_distribution(self, *args: Any, **kwargs: Any) -> Any:
        # Signatures differ between the families: (obs), (obs, action_masks), (obs, lstm_states, episode_starts)
        self.project_log_std()
        return super().get_distribution(*args, **kwargs)  # type: ignore[misc]  # the SB3 policy next in the MRO has it

    def set_training_mode(self, mode: bool) -> None:
        """
        SB3's ``set_training_mode``, which the on-policy algorithms call at the start of each rollout (``False``) and
        of each update (``True``); also projects the log-std parameter (:meth:`project_log_std`).

        With ``normalize_observations``, these calls delimit the rollouts whose observations the statistics take:
        a rollout starts at a switch to evaluation mode outside :meth:`outside_rollouts` (``predict`` runs in it). At
        its first step the statistics take in the rollouts already trained on, and they stay fixed until the next
        rollout's first step, so that an update recomputes exactly the log-probabilities its rollout stored. The
        observations its ``forward`` calls see are kept, and join the pending statistics when it ends.

        :param mode: True for training mode (an update), False for evaluation mode (a rollout, ``predict``)
        """
        self.project_log_std()
        if self.normalize_observations:
            self._delimit_rollouts(mode)
        super().set_training_mode(mode)

    def _delimit_rollouts(self, mode: bool) -> None:
        normalizer = self.observation_normalizer
        if mode:
            # An update starts: its rollout's observations wait in the pending statistics until the next rollout
            self._fold_rollout()
            self._collecting_observations = False
        elif not (self._outside_rollouts or self._collecting_observations):
            normalizer.commit_due = True
            self._collecting_observations = True
        normalizer.observing = self._collecting_observations and not self._outside_rollouts

    def _fold_rollout(self) -> None:
        try:
            self.observation_normalizer.fold()
        except NonFiniteError:
            # The rollout ends with the error: what the policy computes next is no rollout's
            self._collecting_observations = self.observation_normalizer.observing = False
            raise

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data.update({keyword: getattr(self, keyword) for keyword in self.safe_keywords})
        return data


class SafeActorCriticPolicy(SafeDistributionMixin, ActorCriticPolicy):
    """
    SB3's ``ActorCriticPolicy`` (``"MlpPolicy"``) with action distributions that cannot become non-finite.

    Accepts every ``ActorCriticPolicy`` keyword, plus:

    :param observation_space: the observation space (the algorithm passes it)
    :param action_space: the action space (the algorithm passes it)
    :param lr_schedule: the learning-rate schedule the optimizer starts from (the algorithm passes it)
    :param log_std_range: ``(lo, hi)``, Box actions: the std of every action dimension is always in
        ``[exp(lo), exp(hi)]`` (with gSDE too), and the log-std parameter is projected back into the range after every
        parameter update (:meth:`project_log_std`: no dead zone). Allowed: ``-40 <= lo < hi <= 40``.
    :param logit_bound: Discrete, MultiDiscrete and MultiBinary actions: logits are mapped smoothly into
        ``(-logit_bound, logit_bound)``, so every action keeps a known minimum probability
        (see :func:`sb3_safe.common.distributions.min_action_probability`). ``None`` keeps SB3's raw logits.
    :param squash_output: Box actions: a tanh-squashed Gaussian rescaled to the Box bounds, also without gSDE
        (SB3 requires gSDE), with log-probs exact and finite even when tanh saturates.
    :param use_sde: generalized State Dependent Exploration, with the std bounded by ``log_std_range`` (the
        algorithm passes its own ``use_sde``)
    :param normalize_observations: ``True``: normalize Box observations with running statistics of those the
        rollouts saw, as ``VecNormalize(norm_obs=True)`` does, the statistics kept in the policy (saved with the model,
        restored by the guard's rollback) and fixed from a rollout to the end of its update. Not for Dict or image
        observations. ``False`` (the default): SB3's computation. ``"auto"``: on for Box observations that are not
        images (KLAdaptivePPO's default; it and SafeA2C turn ``"auto"`` off where their env is a
        ``VecNormalize(norm_obs=True)``: never normalize twice).
    :param kwargs: the other keywords of SB3's
        :sb3:`ActorCriticPolicy <modules/ppo.html#stable_baselines3.common.policies.ActorCriticPolicy>`, with their
        meaning there: ``net_arch``, ``activation_fn``, ``ortho_init``, ``log_std_init``, ``full_std``,
        ``use_expln``, ``features_extractor_class``, ``features_extractor_kwargs``, ``share_features_extractor``,
        ``normalize_images``, ``optimizer_class``, ``optimizer_kwargs``

    A non-finite network output raises :class:`sb3_safe.NonFiniteError` naming it (mean, log-std or logits).
    The ``state_dict`` keys are those of SB3's policy (checkpoints load both ways), plus ``observation_normalizer.*``
    where observations are normalized.

    The optimizer is built with ``foreach=True`` (see :func:`prefer_foreach`) unless ``optimizer_kwargs`` chooses
    an implementation: the same arithmetic as torch's per-parameter loop, which torch uses by default on CPU,
    with far fewer operator calls per step.
    """

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        lr_schedule: Schedule,
        log_std_range: tuple[float, float] = DEFAULT_LOG_STD_RANGE,
        logit_bound: float | None = DEFAULT_LOGIT_BOUND,
        squash_output: bool = False,
        use_sde: bool = False,
        normalize_observations: NormalizeObservations = False,
        **kwargs: Any,
    ):
        sb3_squash_output = self._init_safe_arguments(
            action_space, log_std_range, logit_bound, squash_output, use_sde, observation_space, normalize_observations
        )
        super().__init__(
            observation_space, action_space, lr_schedule, squash_output=sb3_squash_output, use_sde=use_sde, **kwargs
        )
        self._squash_output = squash_output

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any:
        """
        ``th.nn.Module.load_state_dict``; a state dict saved with ``normalize_value`` installs the normalized value head
        first, so any algorithm loads it (stock PPO's load of a KLAdaptivePPO checkpoint included).

        :param state_dict: the parameters and buffers to load
        :param strict: whether the keys must match this module's exactly
        :param assign: whether to assign the loaded tensors instead of copying into the existing ones
        :return: the missing and unexpected keys
        """
        install_saved_value_normalization(self, state_dict)
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def _set_safe_action_dist(self) -> None:
        self.action_dist = make_safe_distribution(
            self.action_space,
            log_std_range=self.log_std_range,
            logit_bound=self.logit_bound,
            squash_output=self._tanh_squash,
            use_sde=self.use_sde,
            dist_kwargs=self.dist_kwargs,
        )


def outside_rollouts(policy: BasePolicy) -> contextlib.AbstractContextManager[None]:
    """
    :param policy: any SB3 policy
    :return: :meth:`SafeDistributionMixin.outside_rollouts` of a safe policy, a context that does nothing for others
    """
    return policy.outside_rollouts() if isinstance(policy, SafeDistributionMixin) else contextlib.nullcontext()


def warn_about_arguments_without_effect(
    action_space: spaces.Space, log_std_range: tuple[float, float], logit_bound: float | None
) -> None:
    """
    Warn when ``log_std_range`` is set for discrete actions or ``logit_bound`` for Box actions: a setting that
    silently does nothing is usually a mistake (the wrong environment, or the wrong keyword).

    :param action_space: the policy's action space
    :param log_std_range: the validated ``log_std_range``
    :param logit_bound: the validated ``logit_bound``
    """
    continuous = isinstance(action_space, spaces.Box)
    if not continuous and log_std_range != DEFAULT_LOG_STD_RANGE:
        warnings.warn(f"log_std_range={log_std_range} has no effect: the action space {action_space} is not a Box")
    if continuous and logit_bound != DEFAULT_LOGIT_BOUND:
        warnings.warn(f"logit_bound={logit_bound} has no effect: the action space {action_space} is a Box")


def prefer_foreach(optimizer_class: type[th.optim.Optimizer], optimizer_kwargs: dict[str, Any]) -> dict[str, Any]:
    """
    ``optimizer_kwargs`` with ``foreach=True`` added when ``optimizer_class`` has a ``foreach`` option and the caller
    chose none (no ``foreach`` given, ``fused`` and ``differentiable`` not set).

    torch uses its multi-tensor (``foreach``) implementation by default only on accelerators; on CPU it steps one
    parameter at a time, a dozen small operations each. Both implementations compute the same values (tested
    bit for bit for Adam and RMSprop); with a small policy the per-operation cost is a large part of an update.

    :param optimizer_class: the policy's optimizer class
    :param optimizer_kwargs: its keyword arguments (not modified)
    """
    chosen = "foreach" in optimizer_kwargs or optimizer_kwargs.get("fused") or optimizer_kwargs.get("differentiable")
    if chosen or "foreach" not in inspect.signature(optimizer_class).parameters:
        return optimizer_kwargs
    return {**optimizer_kwargs, "foreach": True}


class SafeCnnPolicy(SafeActorCriticPolicy, ActorCriticCnnPolicy):
    """
    :class:`SafeActorCriticPolicy` for image observations, with SB3's ``NatureCNN`` features extractor by
    default, like ``ActorCriticCnnPolicy`` (``"CnnPolicy"``).

    :param args: the observation space, the action space and the learning-rate schedule, as for
        :class:`SafeActorCriticPolicy`
    :param features_extractor_class: the network that turns images into features (SB3's ``NatureCNN``)
    :param kwargs: the keywords of :class:`SafeActorCriticPolicy`
    """

    def __init__(self, *args: Any, features_extractor_class: type = NatureCNN, **kwargs: Any):
        super().__init__(*args, features_extractor_class=features_extractor_class, **kwargs)


class SafeMultiInputPolicy(SafeActorCriticPolicy, MultiInputActorCriticPolicy):
    """
    :class:`SafeActorCriticPolicy` for Dict observations, with SB3's ``CombinedExtractor`` by default, like
    ``MultiInputActorCriticPolicy`` (``"MultiInputPolicy"``).

    :param args: the observation space, the action space and the learning-rate schedule, as for
        :class:`SafeActorCriticPolicy`
    :param features_extractor_class: the network that turns each observation key into features and concatenates
        them (SB3's ``CombinedExtractor``)
    :param kwargs: the keywords of :class:`SafeActorCriticPolicy`
    """

    def __init__(self, *args: Any, features_extractor_class: type = CombinedExtractor, **kwargs: Any):
        super().__init__(*args, features_extractor_class=features_extractor_class, **kwargs)


SafeMlpPolicy = SafeActorCriticPolicy
