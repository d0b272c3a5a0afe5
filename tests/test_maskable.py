"""The safe maskable policies (sb3-contrib's MaskablePPO): bounded logits, then the mask."""

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from faults import NaNAfterOptimizerStep
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st
from sb3_contrib import MaskablePPO
from sb3_contrib.common.maskable.distributions import MaskableCategoricalDistribution
from sb3_contrib.common.maskable.policies import (
    MaskableActorCriticCnnPolicy,
    MaskableActorCriticPolicy,
    MaskableMultiInputActorCriticPolicy,
)
from sb3_contrib.common.wrappers import ActionMasker
from stable_baselines3.common.envs import FakeImageEnv, SimpleMultiObsEnv

from sb3_safe import (
    NonFiniteError,
    NonFiniteGuardCallback,
    NonFiniteGuardWarning,
    SafeMaskableCnnPolicy,
    SafeMaskableMlpPolicy,
    SafeMaskableMultiInputPolicy,
)
from sb3_safe.common.distributions import DEFAULT_LOGIT_BOUND, SafeCategoricalDistribution, min_action_probability
from sb3_safe.common.maskable.distributions import (
    SafeMaskableBernoulliDistribution,
    SafeMaskableCategoricalDistribution,
    SafeMaskableMultiCategoricalDistribution,
    make_safe_masked_distribution,
)
from sb3_safe.common.policies import SafeDistributionMixin

HUGE = float(np.float32(1e30))
EXTREMES = [0.0, 1.0, 20.0, 1e4, 1e10, HUGE]
# Network outputs: anything finite up to +-1e30, with the extremes drawn often
network_output = st.one_of(
    st.sampled_from([sign * value for value in EXTREMES for sign in (1.0, -1.0)]),
    st.floats(-HUGE, HUGE, width=32),
)
logit_bounds = st.one_of(st.sampled_from([0.1, 1.0, 10.0, 100.0]), st.floats(0.01, 100.0))
BATCH = 3
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a log folder the guard writes its report to the current directory: keep it out of the checkout."""
    monkeypatch.chdir(tmp_path)


@st.composite
def logits_and_masks(draw: Any, action_dims: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """A batch of finite logits and masks with at least one valid action in each categorical of each row."""
    total = sum(action_dims)
    logits = np.array(draw(st.lists(network_output, min_size=BATCH * total, max_size=BATCH * total)), np.float32)
    masks = np.array(draw(st.lists(st.booleans(), min_size=BATCH * total, max_size=BATCH * total))).reshape(BATCH, total)
    start = 0
    for dim in action_dims:
        for row in range(BATCH):
            masks[row, start + draw(st.integers(0, dim - 1))] = True
        start += dim
    return logits.reshape(BATCH, total), masks


def log_min_probability(n_valid: int, bound: float) -> float:
    """``log(min_action_probability(n_valid, bound))``, in log space: the probability underflows for large bounds."""
    return -math.log1p((n_valid - 1) * math.exp(2 * bound))


def assert_masked_categoricals_are_safe(dist: Any, logits: th.Tensor, masks: np.ndarray, dims: list[int], bound: float):
    """Each categorical: masked probabilities exactly 0, valid ones at least the minimum; all finite, gradients too."""
    categoricals = [dist.distribution] if isinstance(dist, MaskableCategoricalDistribution) else dist.distributions
    total_log_prob = th.zeros(())
    for categorical, mask in zip(categoricals, np.split(masks, np.cumsum(dims)[:-1], axis=1), strict=True):
        mask_tensor = th.as_tensor(mask)
        assert bool((categorical.probs[~mask_tensor] == 0.0).all())
        log_probs = categorical.logits
        for row in range(len(mask)):
            n_valid = int(mask[row].sum())
            valid_log_probs = log_probs[row][mask_tensor[row]]
            minimum = log_min_probability(n_valid, bound)
            assert valid_log_probs.min().item() >= minimum - 1e-4 * max(1.0, abs(minimum))
            total_log_prob = total_log_prob + valid_log_probs.sum()
        samples = categorical.sample((20,))
        assert bool(mask_tensor.gather(1, samples.T).all())
        assert bool(mask_tensor.gather(1, categorical.probs.argmax(dim=1, keepdim=True)).all())
    entropy = dist.entropy()
    actions = dist.sample()
    log_prob = dist.log_prob(actions)
    (total_log_prob + entropy.sum() + log_prob.sum()).backward()
    assert bool(th.isfinite(total_log_prob)) and bool(th.isfinite(entropy).all()) and bool(th.isfinite(log_prob).all())
    assert bool((entropy >= -1e-5).all())
    assert logits.grad is not None and bool(th.isfinite(logits.grad).all())


# ----- distributions -----


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 12).flatmap(lambda n: st.tuples(st.just(n), logits_and_masks([n]))), logit_bounds)
def test_masked_categorical_probabilities_for_extreme_logits(case: tuple[int, tuple[np.ndarray, np.ndarray]], bound: float):
    n_actions, (logit_values, masks) = case
    logits = th.tensor(logit_values).requires_grad_()
    dist = SafeMaskableCategoricalDistribution(n_actions, bound).proba_distribution(logits)
    dist.apply_masking(masks)
    assert_masked_categoricals_are_safe(dist, logits, masks, [n_actions], bound)
    assert bool(th.as_tensor(masks).gather(1, dist.mode()[:, None]).all())


@settings(max_examples=100, deadline=None)
@given(logits_and_masks([3, 1, 5]), logit_bounds)
def test_masked_multicategorical_probabilities_for_extreme_logits(case: tuple[np.ndarray, np.ndarray], bound: float):
    logit_values, masks = case
    logits = th.tensor(logit_values).requires_grad_()
    dist = SafeMaskableMultiCategoricalDistribution([3, 1, 5], bound).proba_distribution(logits)
    dist.apply_masking(masks)
    assert_masked_categoricals_are_safe(dist, logits, masks, [3, 1, 5], bound)


@settings(max_examples=100, deadline=None)
@given(logits_and_masks([2] * 4), logit_bounds)
def test_masked_multibinary_probabilities_for_extreme_logits(case: tuple[np.ndarray, np.ndarray], bound: float):
    logit_values, masks = case
    logits = th.tensor(logit_values).requires_grad_()
    dist = SafeMaskableBernoulliDistribution(4, bound).proba_distribution(logits)
    dist.apply_masking(masks)
    assert_masked_categoricals_are_safe(dist, logits, masks, [2] * 4, bound)


def extreme_logits(n_actions: int, batch: int = 2, seed: int = 0) -> th.Tensor:
    generator = np.random.default_rng(seed)
    return th.tensor(generator.choice([-HUGE, -1e4, 0.0, 1e4, HUGE], size=(batch, n_actions)), dtype=th.float32)


def test_ten_thousand_actions_with_random_masks():
    n_actions = 10_000
    logits = extreme_logits(n_actions).requires_grad_()
    masks = np.random.default_rng(1).random((2, n_actions)) < 0.5
    dist = SafeMaskableCategoricalDistribution(n_actions).proba_distribution(logits)
    dist.apply_masking(masks)
    assert_masked_categoricals_are_safe(dist, logits, masks, [n_actions], DEFAULT_LOGIT_BOUND)
    probs = dist.distribution.probs
    # The default bound keeps the minimum well inside float32 for 10,000 actions
    for row in range(2):
        n_valid = int(masks[row].sum())
        assert probs[row][th.as_tensor(masks[row])].min().item() >= min_action_probability(n_valid, DEFAULT_LOGIT_BOUND) * (
            1 - 1e-4
        )
    assert th.allclose(probs.sum(dim=1), th.ones(2))


def test_single_valid_action_is_certain():
    n_actions = 10_000
    logits = extreme_logits(n_actions).requires_grad_()
    masks = np.zeros((2, n_actions), dtype=bool)
    masks[0, 17], masks[1, n_actions - 1] = True, True
    dist = SafeMaskableCategoricalDistribution(n_actions).proba_distribution(logits)
    dist.apply_masking(masks)
    assert_masked_categoricals_are_safe(dist, logits, masks, [n_actions], DEFAULT_LOGIT_BOUND)
    expected = th.tensor([17, n_actions - 1])
    assert th.equal(dist.distribution.probs[th.arange(2), expected], th.ones(2))
    assert th.equal(dist.sample(), expected) and th.equal(dist.mode(), expected)
    assert th.equal(dist.log_prob(expected), th.zeros(2))
    assert th.equal(dist.entropy(), th.zeros(2))


def test_all_valid_mask_equals_the_unmasked_safe_categorical():
    logits = extreme_logits(10_000)
    dist = SafeMaskableCategoricalDistribution(10_000, 3.0).proba_distribution(logits)
    dist.apply_masking(np.ones((2, 10_000), dtype=bool))
    unmasked = SafeCategoricalDistribution(10_000, 3.0).proba_distribution(logits)
    assert th.allclose(dist.distribution.probs, unmasked.distribution.probs, rtol=1e-5, atol=0.0)
    assert th.allclose(dist.entropy(), unmasked.entropy())


def test_mask_can_change_and_be_removed():
    logits = th.zeros(1, 4)
    dist = SafeMaskableCategoricalDistribution(4).proba_distribution(logits)
    dist.apply_masking(np.array([[True, False, False, False]]))
    assert dist.distribution.probs[0, 0].item() == 1.0
    dist.apply_masking(np.array([[False, False, True, True]]))
    assert th.equal(dist.distribution.probs, th.tensor([[0.0, 0.0, 0.5, 0.5]]))
    dist.apply_masking(None)
    assert th.allclose(dist.distribution.probs, th.full((1, 4), 0.25))


def test_stock_masking_of_extreme_logits_gives_masked_actions_probability():
    """Why the logits are bounded first: sb3-contrib's -1e8 is no mask for raw logits below -1e8."""
    logits = th.tensor([[-1e30, -1e30, 0.0]])
    masks = np.array([[True, True, False]])
    stock = MaskableCategoricalDistribution(3).proba_distribution(logits)
    stock.apply_masking(masks)
    assert stock.distribution.probs[0, 2].item() == 1.0  # all the probability on the masked action
    safe = SafeMaskableCategoricalDistribution(3).proba_distribution(logits)
    safe.apply_masking(masks)
    assert th.equal(safe.distribution.probs, th.tensor([[0.5, 0.5, 0.0]]))


def test_no_simplex_validation_error_with_validation_on():
    """torch validates distribution arguments by default; the safe distributions never validate, over 10,000 actions."""
    previous = th.distributions.Distribution._validate_args
    th.distributions.Distribution.set_default_validate_args(True)
    try:
        logits = (th.randn(64, 10_000, generator=th.Generator().manual_seed(0)) * 30).requires_grad_()
        masks = np.random.default_rng(0).random((64, 10_000)) < 0.9
        masks[:, 0] = True
        dist = SafeMaskableCategoricalDistribution(10_000)
        for _ in range(3):  # as MaskablePPO does at each forward pass
            dist.proba_distribution(logits)
            dist.apply_masking(masks)
            actions = dist.sample()
            (dist.log_prob(actions).sum() + dist.entropy().sum()).backward()
        assert not dist.distribution._validate_args
    finally:
        th.distributions.Distribution.set_default_validate_args(previous)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize(
    "dist",
    [
        SafeMaskableCategoricalDistribution(6),
        SafeMaskableMultiCategoricalDistribution([2, 4]),
        SafeMaskableBernoulliDistribution(3),
    ],
)
def test_nonfinite_logits_raise_named_error(dist: Any, bad: float):
    logits = th.zeros(2, 6)
    logits[1, 3] = bad
    with pytest.raises(NonFiniteError, match="policy output logits: "):
        dist.proba_distribution(logits)


def test_mask_without_valid_action_is_rejected():
    dist = SafeMaskableCategoricalDistribution(3).proba_distribution(th.zeros(2, 3))
    with pytest.raises(ValueError, match=r"action mask allows no action at row 1 sub-space 0"):
        dist.apply_masking(np.array([[True, False, False], [False, False, False]]))
    multi = SafeMaskableMultiCategoricalDistribution([2, 3]).proba_distribution(th.zeros(1, 5))
    with pytest.raises(ValueError, match=r"row 0 sub-space 1"):
        multi.apply_masking(np.array([True, True, False, False, False]))


def test_unbounded_logits_are_sb3_contribs():
    logits = th.tensor([[-3.0, 40.0, 2.0, 0.5]])
    masks = np.array([[True, False, True, True]])
    stock = MaskableCategoricalDistribution(4).proba_distribution(logits)
    safe = SafeMaskableCategoricalDistribution(4, logit_bound=None).proba_distribution(logits)
    for dist in (stock, safe):
        dist.apply_masking(masks)
    assert th.allclose(safe.distribution.probs, stock.distribution.probs)


@pytest.mark.parametrize("logit_bound", [0.0, -1.0, float("nan"), 1000.0])
def test_invalid_logit_bound_is_rejected(logit_bound: float):
    with pytest.raises(ValueError, match="logit_bound"):
        make_safe_masked_distribution(spaces.Discrete(3), logit_bound)
    with pytest.raises(ValueError, match="logit_bound"):
        MaskablePPO(SafeMaskableMlpPolicy, ChangingMaskEnv(spaces.Discrete(3)), policy_kwargs=dict(logit_bound=logit_bound))


def test_box_actions_are_not_supported():
    with pytest.raises(NotImplementedError, match="Box"):
        make_safe_masked_distribution(spaces.Box(-1, 1, (2,)))


# ----- policies in MaskablePPO -----


class ChangingMaskEnv(gym.Env):
    """
    Random observations; a new random mask at every step (at least one valid action per categorical). The
    reward is 1 for the highest valid action of the first categorical, and any masked action taken is counted.
    """

    observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)

    def __init__(self, action_space: spaces.Space):
        super().__init__()
        self.action_space = action_space
        if isinstance(action_space, spaces.Discrete):
            self.dims = [int(action_space.n)]
        elif isinstance(action_space, spaces.MultiDiscrete):
            self.dims = [int(n) for n in action_space.nvec]
        else:
            self.dims = [2] * int(action_space.n)
        self.invalid_actions = 0
        self.n_steps = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._steps = 0
        self._new_mask()
        return self.observation_space.sample(), {}

    def _new_mask(self) -> None:
        self._mask = self.np_random.random(sum(self.dims)) < 0.5
        start = 0
        for dim in self.dims:
            self._mask[start + self.np_random.integers(dim)] = True
            start += dim

    def action_masks(self) -> np.ndarray:
        return self._mask.copy()

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        chosen = np.atleast_1d(action).astype(np.int64)
        offsets = np.concatenate([[0], np.cumsum(self.dims)[:-1]])
        self.invalid_actions += int((~self._mask[offsets + chosen]).sum())
        self.n_steps += 1
        reward = float(chosen[0] == np.flatnonzero(self._mask[: self.dims[0]]).max())
        self._steps += 1
        self._new_mask()
        return self.observation_space.sample(), reward, False, self._steps >= 20, {}


SPACES = {
    "discrete": spaces.Discrete(5),
    "multidiscrete": spaces.MultiDiscrete([3, 4]),
    "multibinary": spaces.MultiBinary(3),
}
EXPECTED_DISTRIBUTION = {
    "discrete": SafeMaskableCategoricalDistribution,
    "multidiscrete": SafeMaskableMultiCategoricalDistribution,
    "multibinary": SafeMaskableBernoulliDistribution,
}
SMALL = dict(n_steps=64, batch_size=32, n_epochs=2)


def parameters_finite(model: Any) -> bool:
    return all(bool(th.isfinite(parameter).all()) for parameter in model.policy.parameters())


@pytest.mark.parametrize("space", SPACES)
def test_masks_changing_every_step_are_always_respected(space: str, tmp_path: Path, device: str):
    """MaskablePPO trains on masks that change at every step: no masked action is ever taken, also after loading."""
    env = ChangingMaskEnv(SPACES[space])
    model = MaskablePPO(
        SafeMaskableMlpPolicy, env, seed=0, device=device, policy_kwargs=dict(net_arch=[16], logit_bound=5.0), **SMALL
    )
    model.learn(256)
    assert env.n_steps >= 256 and env.invalid_actions == 0
    assert parameters_finite(model)
    assert isinstance(model.policy.action_dist, EXPECTED_DISTRIBUTION[space])

    model.save(tmp_path / "model.zip")
    loaded = MaskablePPO.load(tmp_path / "model.zip", device=device)
    assert type(loaded.policy) is SafeMaskableMlpPolicy
    assert loaded.policy.logit_bound == 5.0 and loaded.policy.action_dist.logit_bound == 5.0
    observations = np.stack([env.observation_space.sample() for _ in range(6)])
    masks = []
    for _ in range(6):
        env._new_mask()
        masks.append(env.action_masks())
    expected, _ = model.predict(observations, action_masks=np.stack(masks), deterministic=True)
    actual, _ = loaded.predict(observations, action_masks=np.stack(masks), deterministic=True)
    np.testing.assert_array_equal(actual, expected)
    # a few more steps with the loaded model: still no masked action
    loaded.set_env(env)
    loaded.learn(64, reset_num_timesteps=False)
    assert env.invalid_actions == 0


def test_policy_save_load_restores_logit_bound(tmp_path: Path):
    policy = MaskablePPO(
        SafeMaskableMlpPolicy, ChangingMaskEnv(spaces.Discrete(3)), policy_kwargs=dict(logit_bound=2.5)
    ).policy
    policy.save(str(tmp_path / "policy.pt"))
    loaded = SafeMaskableMlpPolicy.load(str(tmp_path / "policy.pt"))
    assert loaded.logit_bound == 2.5 and loaded.action_dist.logit_bound == 2.5
    assert "log_std_range" not in loaded._get_constructor_parameters()


def test_cnn_policy_on_images():
    env = ActionMasker(
        FakeImageEnv(screen_height=36, screen_width=36, n_channels=1, discrete=True), lambda env: [True, False] * 3
    )
    model = MaskablePPO(SafeMaskableCnnPolicy, env, seed=0, policy_kwargs=dict(logit_bound=4.0), **SMALL).learn(64)
    assert isinstance(model.policy, MaskableActorCriticCnnPolicy)
    assert model.policy.action_dist.logit_bound == 4.0
    assert parameters_finite(model)


def test_multi_input_policy_on_dict_observations():
    env = ActionMasker(SimpleMultiObsEnv(random_start=False), lambda env: [True, True, False, True])
    model = MaskablePPO(SafeMaskableMultiInputPolicy, env, seed=0, **SMALL).learn(64)
    assert isinstance(model.policy, MaskableMultiInputActorCriticPolicy)
    assert parameters_finite(model)


def test_stock_checkpoint_loads_into_safe_policy(tmp_path: Path):
    env = ChangingMaskEnv(spaces.Discrete(5))
    stock = MaskablePPO("MlpPolicy", env, seed=1)
    safe = MaskablePPO(SafeMaskableMlpPolicy, env, seed=2)
    safe_keys = [key for key in safe.policy.state_dict() if not key.startswith("observation_normalizer.")]
    assert list(stock.policy.state_dict()) == safe_keys
    stock.save(tmp_path / "stock.zip")
    safe.set_parameters(str(tmp_path / "stock.zip"))
    assert not safe.policy.normalize_observations
    observations = np.stack([env.observation_space.sample() for _ in range(8)])
    masks = np.ones((8, 5), dtype=bool)
    np.testing.assert_array_equal(
        safe.predict(observations, action_masks=masks, deterministic=True)[0],
        stock.predict(observations, action_masks=masks, deterministic=True)[0],
    )


def test_nonfinite_weights_raise_named_error(device: str):
    model = MaskablePPO(SafeMaskableMlpPolicy, ChangingMaskEnv(spaces.Discrete(5)), device=device, **SMALL)
    with th.no_grad():
        model.policy.action_net.weight[2, 0] = float("nan")
    with pytest.raises(NonFiniteError, match="policy output logits: 1 NaN, 0 inf of 5"):
        model.predict(np.zeros(4, dtype=np.float32), action_masks=np.ones(5, dtype=bool))


def test_policy_classes_subclass_their_sb3_contrib_counterparts():
    assert issubclass(SafeMaskableMlpPolicy, MaskableActorCriticPolicy)
    assert issubclass(SafeMaskableCnnPolicy, MaskableActorCriticCnnPolicy)
    assert issubclass(SafeMaskableMultiInputPolicy, MaskableMultiInputActorCriticPolicy)
    for policy in (SafeMaskableMlpPolicy, SafeMaskableCnnPolicy, SafeMaskableMultiInputPolicy):
        assert issubclass(policy, SafeDistributionMixin)


def test_guard_rolls_back_a_nan_weight_and_training_continues():
    env = ChangingMaskEnv(spaces.Discrete(5))
    model = MaskablePPO(SafeMaskableMlpPolicy, env, seed=0, policy_kwargs=dict(net_arch=[16]), **SMALL)
    corrupt = NaNAfterOptimizerStep(model.policy.optimizer, at=3, weight=model.policy.action_net.weight)
    guard = NonFiniteGuardCallback(on_nonfinite="rollback")
    with pytest.warns(NonFiniteGuardWarning, match="action_net.weight: 1 NaN"):
        model.learn(256, callback=guard)
    assert [event.action for event in guard.events] == ["rollback"]
    assert guard.stop_reason is None and model.num_timesteps == 256
    assert corrupt.calls > 3  # optimizer steps after the rollback
    assert parameters_finite(model) and env.invalid_actions == 0


# ----- example -----


def test_example_trains_and_evaluates(tmp_path: Path):
    command = [sys.executable, str(EXAMPLES / "maskable.py"), "--output", str(tmp_path), "--timesteps", "512"]
    command += ["--eval-episodes", "2"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stdout.splitlines()
    assert lines[-4] == f"saved model: {tmp_path / 'maskable_ppo_machines.zip'}"
    assert lines[-3] == "optimal schedule 18.2, best ready machine 15.0, random ready machine 12.3"
    assert lines[-2].startswith("without masks: mean return ")
    assert lines[-1].startswith("evaluation over 2 episodes (masked): mean return ")
    # With the masks no machine is ever run while cooling down: no -1 penalty, and at least the worst schedule's 0
    assert float(lines[-1].split("mean return ")[1].split(" +/- ")[0]) >= 0.0
    model = MaskablePPO.load(tmp_path / "maskable_ppo_machines.zip", device="cpu")
    assert isinstance(model.policy, SafeMaskableMlpPolicy) and model.num_timesteps == 512
