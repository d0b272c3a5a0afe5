"""
Observation normalization inside the safe policies (``normalize_observations=True``): outputs finite and clipped for
any input, exact running statistics, fixed from a rollout to the end of its update (the update recomputes the
rollout's log-probabilities and values exactly), saved with the model, restored by a rollback, left out of the
doctor's weights; refused for spaces it cannot normalize, and nothing changed when off.
"""

import math
import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from faults import NaNAfterOptimizerStep
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st
from sb3_contrib import MaskablePPO, RecurrentPPO
from stable_baselines3 import A2C, PPO
from stable_baselines3.common.callbacks import BaseCallback, EvalCallback
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

from sb3_safe import (
    KLAdaptiveLRCallback,
    KLAdaptivePPO,
    NonFiniteError,
    NonFiniteGuardCallback,
    SafeA2C,
    SafeCnnPolicy,
    SafeMlpPolicy,
)
from sb3_safe.common.maskable import SafeMaskableMlpPolicy
from sb3_safe.common.numerics import note_restore
from sb3_safe.common.observation_norm import CLIP, KEPT_ELEMENTS, STATISTICS, ObservationNormalizer
from sb3_safe.common.recurrent import SafeMlpLstmPolicy
from sb3_safe.doctor import diagnose

SCALE = 1e9
ON = dict(normalize_observations=True)


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard writes its reports to the current directory: keep them out of the checkout."""
    monkeypatch.chdir(tmp_path)


class RawUnits(gym.ObservationWrapper):
    """CartPole-v1's observations times :data:`SCALE` plus an offset: sensor units nobody normalized."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.observation_space = spaces.Box(-np.inf, np.inf, (4,), np.float32)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return (observation * SCALE + 3 * SCALE).astype(np.float32)

    def action_masks(self) -> np.ndarray:
        """Both actions valid (for MaskablePPO)."""
        return np.ones(2, dtype=bool)


def raw_cartpole() -> gym.Env:
    return RawUnits(gym.make("CartPole-v1"))


# ----- the normalizer's numbers -----

finite32 = st.floats(allow_nan=False, allow_infinity=False, width=32)
batches = st.lists(st.lists(finite32, min_size=3, max_size=3), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(st.lists(batches, min_size=1, max_size=4), st.lists(st.lists(st.floats(width=32), min_size=3, max_size=3)))
def test_outputs_are_finite_and_clipped_for_any_input(observed: list[list[list[float]]], inputs: list[list[float]]) -> None:
    """Statistics of any finite observations (up to float32's range), any input: finite and within [-CLIP, CLIP] where
    the input is finite, NaN where it is not (an inf observation is not clipped into a plausible value: the network's
    output check names it), in float32 and in float64."""
    normalizer = ObservationNormalizer((3,))
    for batch in observed:
        normalizer.observe(th.tensor(batch, dtype=th.float32))
        normalizer.commit()
    for dtype in (th.float32, th.float64):
        values = th.tensor(inputs or [[0.0, 0.0, 0.0]], dtype=dtype)
        out = normalizer(values)
        assert out.dtype == dtype
        finite_in = th.isfinite(values)
        assert th.isfinite(out[finite_in]).all()
        assert (out[finite_in].abs() <= CLIP).all()
        assert th.isnan(out[~finite_in]).all()


@settings(max_examples=200, deadline=None)
@given(st.lists(batches, min_size=1, max_size=5), st.integers(0, 4))
def test_statistics_are_the_exact_mean_and_variance_of_the_rows(observed: list[list[list[float]]], commit_every: int) -> None:
    """Batches observed one after another, committed at any point: the statistics equal the mean and population
    variance of every row, the pending ones included once committed."""
    normalizer = ObservationNormalizer((3,))
    for index, batch in enumerate(observed):
        normalizer.observe(th.tensor(batch, dtype=th.float32))
        if commit_every and index % commit_every == 0:
            normalizer.commit()
    normalizer.commit()
    every = np.concatenate([np.asarray(batch, dtype=np.float32).astype(np.float64) for batch in observed])
    assert normalizer.obs_count.item() == len(every)
    assert normalizer.pending_count.item() == 0
    scale = max(1.0, float(np.abs(every).max()))
    np.testing.assert_allclose(normalizer.obs_mean.numpy(), every.mean(axis=0), rtol=1e-9, atol=1e-12 * scale)
    np.testing.assert_allclose(normalizer.obs_var.numpy(), every.var(axis=0), rtol=1e-9, atol=1e-12 * scale**2)


@settings(max_examples=300, deadline=None)
@given(batches, st.lists(st.lists(finite32, min_size=3, max_size=3), min_size=1, max_size=4))
def test_float32_outputs_are_the_float64_formula_up_to_the_rounding_of_the_mean(
    observed: list[list[float]], inputs: list[list[float]]
) -> None:
    """Float32 observations are normalized in float32 with a shift and scale derived from the float64 statistics: the
    result differs from ``(obs - mean) / std`` in float64 by at most the mean's rounding to float32 (half a unit in its
    last place, in units of std) and a few float32 roundings of the result; statistics wider than float32 can scale
    are applied in float64."""
    normalizer = ObservationNormalizer((3,))
    normalizer.observe(th.tensor(observed, dtype=th.float32))
    normalizer.commit()
    values = th.tensor(inputs, dtype=th.float32)
    out = normalizer(values).double().numpy()
    mean, std = normalizer.obs_mean.numpy(), np.sqrt(np.maximum(normalizer.obs_var.numpy(), 1e-8))
    exact = np.clip((values.double().numpy() - mean) / std, -CLIP, CLIP)
    mean_rounding = np.abs(mean.astype(np.float32).astype(np.float64) - mean) / std
    assert np.all(np.abs(out - exact) <= mean_rounding + 4 * 2.0**-24 * np.abs(exact) + 1e-30)
    if std.max() > 1e30:
        assert np.array_equal(out, exact.astype(np.float32))


def test_float64_observations_are_normalized_in_float64() -> None:
    """Observations in float64 (a user's features extractor input) get the float64 formula exactly, not the float32
    shift and scale."""
    normalizer = ObservationNormalizer((2,))
    normalizer.observe(th.tensor([[0.1, 1e6], [0.3, 1e6 + 3.0], [0.7, 1e6 + 5.0]], dtype=th.float64))
    normalizer.commit()
    values = th.tensor([[0.2, 1e6 + 1.0], [0.65, 1e6 + 4.5]], dtype=th.float64)
    exact = (values - normalizer.obs_mean) / th.sqrt(normalizer.obs_var)
    out = normalizer(values)
    assert out.dtype == th.float64 and th.equal(out, exact.clamp(-CLIP, CLIP))


def test_forward_follows_statistics_written_any_way() -> None:
    """The float32 shift and scale follow the statistics however they change: a commit, a load, a rollback's write
    outside autograd's version counters, a move to float64."""
    normalizer = ObservationNormalizer((1,))
    normalizer.observe(th.tensor([[1.0], [3.0]]))
    normalizer.commit()
    assert normalizer(th.tensor([[3.0]])).item() == 1.0
    saved = {name: tensor.clone() for name, tensor in normalizer.state_dict().items()}
    normalizer.obs_mean.data.copy_(th.tensor([5.0], dtype=th.float64))  # as FlatCopy.restore writes, and says
    note_restore()
    assert normalizer(th.tensor([[3.0]])).item() == -2.0
    normalizer.load_state_dict(saved)
    assert normalizer(th.tensor([[3.0]])).item() == 1.0
    normalizer.double()
    assert normalizer.obs_mean.dtype == th.float64 and normalizer(th.tensor([[5.0]])).item() == 3.0


def test_before_any_statistics_observations_pass_clipped() -> None:
    """Clipped at 10, VecNormalize's default ``clip_obs``; a commit of nothing observed changes nothing; an inf is not
    clipped to 10 but passed on as NaN."""
    normalizer = ObservationNormalizer((2,))
    normalizer.commit()
    out = normalizer(th.tensor([[0.5, -3.0], [1e11, -1e11], [1.0, -math.inf]]))
    assert out[:2].tolist() == [[0.5, -3.0], [10.0, -10.0]]
    assert out[2, 0].item() == 1.0 and math.isnan(out[2, 1].item())


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_observation_is_named_when_folded_and_changes_nothing(bad: float) -> None:
    """A kept observation with NaN or inf: the fold raises NonFiniteError naming the observations and the first bad
    row, and the statistics keep their values."""
    normalizer = ObservationNormalizer((3,))
    normalizer.observe(th.tensor([[1.0, 2.0, 3.0]]))
    normalizer.commit()
    normalizer.observe(th.tensor([[1.0, 0.0, 0.0], [0.0, bad, 0.0], [0.0, 0.0, 0.0]]))
    before = {name: tensor.clone() for name, tensor in normalizer.state_dict().items()}
    with pytest.raises(NonFiniteError, match=r"observations of the rollout: .* in 1 of 3 observed rows \(the first: row 1"):
        normalizer.fold()
    assert all(th.equal(tensor, before[name]) for name, tensor in normalizer.state_dict().items())
    assert normalizer.kept.count == 0


def test_observations_are_kept_until_folded_in_one_update() -> None:
    """A step keeps a copy of its observations (the caller may reuse its array); a fold adds every kept one to the
    pending statistics; what is saved is the statistics, not the observations kept (saving changes nothing); when
    KEPT_ELEMENTS are kept they are folded without being asked, and a batch larger than that is kept whole."""
    normalizer = ObservationNormalizer((2,))
    reused = th.tensor([[1.0, 2.0]], dtype=th.float64)  # the statistics' own dtype: only a copy keeps it apart
    normalizer.observe(reused)
    reused.fill_(100.0)
    normalizer.observe(th.tensor([[3.0, 4.0], [5.0, 6.0]]))
    assert normalizer.pending_count.item() == 0 and normalizer.kept.count == 3
    assert normalizer.state_dict()["pending_count"].item() == 0 and normalizer.kept.count == 3
    normalizer.fold()
    assert normalizer.pending_count.item() == 3 and normalizer.pending_mean.tolist() == [3.0, 4.0]
    assert normalizer.kept.count == 0
    capacity = KEPT_ELEMENTS // 2
    normalizer.observe(th.zeros(capacity - 1, 2))
    normalizer.observe(th.ones(1, 2))
    assert normalizer.kept.count == capacity and normalizer.pending_count.item() == 3
    normalizer.observe(th.ones(1, 2))
    assert normalizer.kept.count == 1 and normalizer.pending_count.item() == 3 + capacity
    normalizer.observe(th.full((capacity + 5, 2), 2.0))
    assert normalizer.kept.count == capacity + 5 and normalizer.pending_count.item() == 4 + capacity
    normalizer.commit()
    assert normalizer.obs_count.item() == 9 + 2 * capacity
    parts = ([[1, 2], [3, 4], [5, 6]], np.zeros((capacity - 1, 2)), np.ones((2, 2)), np.full((capacity + 5, 2), 2.0))
    every = np.concatenate(parts)
    np.testing.assert_allclose(normalizer.obs_mean.numpy(), every.mean(axis=0), rtol=1e-9)
    np.testing.assert_allclose(normalizer.obs_var.numpy(), every.var(axis=0), rtol=1e-9)


def test_small_and_constant_observations() -> None:
    """Observations of 1e-3 are scaled up to unit variance; a constant one maps to 0, not to inf."""
    normalizer = ObservationNormalizer((2,))
    data = th.tensor([[1e-3, 5.0], [3e-3, 5.0], [5e-3, 5.0], [7e-3, 5.0]])
    normalizer.observe(data)
    normalizer.commit()
    out = normalizer(data).double()
    assert out[:, 0].var(unbiased=False).item() == pytest.approx(1.0, rel=1e-6)
    assert out[:, 1].tolist() == [0.0] * 4


def test_observing_takes_no_gradient() -> None:
    """Observations that require a gradient leave no graph in the statistics (saved and copied as plain tensors)."""
    normalizer = ObservationNormalizer((2,))
    normalizer.observe(th.ones(3, 2, requires_grad=True))
    normalizer.commit()
    assert not any(buffer.requires_grad for buffer in normalizer.buffers())


def test_observations_are_scaled_to_zero_mean_and_unit_variance() -> None:
    normalizer = ObservationNormalizer((1,))
    data = th.tensor([[1e11], [3e11], [5e11], [7e11]])
    normalizer.observe(data)
    assert normalizer(data).flatten().tolist() == [CLIP] * 4  # pending: not used before the commit
    normalizer.commit()
    out = normalizer(data).double().flatten()
    assert out.mean().item() == pytest.approx(0.0, abs=1e-6) and out.var(unbiased=False).item() == pytest.approx(1.0)


# ----- in the algorithms -----


class RolloutCheck(BaseCallback):
    """At each rollout's end (before its update): the normalizer's counts, the rollout's observations, and how far
    the policy's log-probabilities and values of the rollout are from those it stored while collecting it."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: list[tuple[float, float]] = []
        self.observations: list[np.ndarray] = []
        self.gaps: list[float] = []

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        buffer, policy = self.model.rollout_buffer, self.model.policy
        normalizer = policy.observation_normalizer
        self.counts.append((normalizer.obs_count.item(), normalizer.pending_count.item()))
        self.observations.append(buffer.observations.reshape(-1, 4).astype(np.float64))
        with th.no_grad():
            values, log_prob, _ = policy.evaluate_actions(
                th.as_tensor(buffer.observations.reshape(-1, 4)), th.as_tensor(buffer.actions.reshape(-1)).long()
            )
        self.gaps.append(
            max(
                np.abs(log_prob.numpy() - buffer.log_probs.reshape(-1)).max(),
                np.abs(values.flatten().numpy() - buffer.values.reshape(-1)).max(),
            )
        )


FEED_FORWARD = [
    pytest.param(PPO, dict(n_steps=32, batch_size=32, n_epochs=2), id="PPO"),
    pytest.param(A2C, dict(n_steps=16), id="A2C"),
    pytest.param(KLAdaptivePPO, dict(n_steps=32, batch_size=32, n_epochs=2, normalize_value=False), id="KLAdaptivePPO"),
    pytest.param(SafeA2C, dict(n_steps=16, normalize_value=False), id="SafeA2C"),
    # An actor and a critic with a features extractor each: both see the normalized observations
    pytest.param(
        PPO,
        dict(n_steps=32, batch_size=32, n_epochs=2, policy_kwargs=dict(share_features_extractor=False, **ON)),
        id="PPO-separate-extractors",
    ),
]


def make_model(algo: type, kwargs: dict[str, Any], n_envs: int = 2) -> Any:
    from stable_baselines3.common.env_util import make_vec_env

    env = make_vec_env(raw_cartpole, n_envs=n_envs, seed=0)
    return algo(SafeMlpPolicy, env, **{"policy_kwargs": ON, **kwargs}, seed=0, device="cpu")


@pytest.mark.parametrize(("algo", "kwargs"), FEED_FORWARD)
def test_statistics_are_fixed_from_a_rollout_to_the_end_of_its_update(algo: type, kwargs: dict[str, Any]) -> None:
    """Observations in units of 1e9: each rollout is normalized by the statistics of the rollouts before the last
    update, so the update recomputes the stored log-probabilities and values exactly (PPO's first ratio is 1), and
    the statistics are exactly those of the earlier rollouts."""
    model = make_model(algo, kwargs)
    rollout = model.n_steps * model.n_envs
    check = RolloutCheck()
    model.learn(4 * rollout, callback=check)
    assert check.counts == [(0.0, rollout), (rollout, rollout), (2 * rollout, rollout), (3 * rollout, rollout)]
    assert max(check.gaps) < 1e-5
    seen = np.concatenate(check.observations[:3])
    normalizer = model.policy.observation_normalizer
    np.testing.assert_allclose(normalizer.obs_mean.numpy(), seen.mean(axis=0), rtol=1e-9)
    np.testing.assert_allclose(normalizer.obs_var.numpy(), seen.var(axis=0), rtol=1e-9)
    # Every features extractor sees observations of unit scale, not 1e9
    seen_by_extractors = []
    for extractor in {id(m): m for m in (model.policy.pi_features_extractor, model.policy.vf_features_extractor)}.values():
        extractor.register_forward_hook(lambda module, args, out: seen_by_extractors.append(args[0]))
    model.policy.predict_values(th.as_tensor(check.observations[-1], dtype=th.float32))
    model.policy.get_distribution(th.as_tensor(check.observations[-1], dtype=th.float32))
    assert len(seen_by_extractors) == 2
    assert all(0.3 < inputs.std().item() < 3.0 for inputs in seen_by_extractors)


@pytest.mark.parametrize(
    ("algo", "policy", "kwargs"),
    [
        pytest.param(RecurrentPPO, SafeMlpLstmPolicy, dict(n_steps=32, batch_size=32, n_epochs=1), id="RecurrentPPO"),
        pytest.param(MaskablePPO, SafeMaskableMlpPolicy, dict(n_steps=32, batch_size=32, n_epochs=1), id="MaskablePPO"),
    ],
)
def test_sb3_contrib_policies_take_the_statistics_of_their_rollouts(algo: type, policy: type, kwargs: dict[str, Any]) -> None:
    model = algo(policy, raw_cartpole(), policy_kwargs=ON, seed=0, device="cpu", **kwargs)
    model.learn(3 * 32)
    normalizer = model.policy.observation_normalizer
    assert (normalizer.obs_count.item(), normalizer.pending_count.item()) == (64, 32)
    # CartPole-v1's observations are within +-0.3 of 0 but for the velocities' tails: about 3e9 in raw units
    assert normalizer.obs_mean.numpy() == pytest.approx([3 * SCALE] * 4, rel=0.2)


def test_saved_and_loaded_with_the_model(tmp_path: Any) -> None:
    model = make_model(PPO, dict(n_steps=32, batch_size=32, n_epochs=1))
    model.learn(3 * 64)
    model.save(tmp_path / "model")
    loaded = PPO.load(tmp_path / "model", device="cpu")
    for name, tensor in model.policy.observation_normalizer.state_dict().items():
        assert th.equal(loaded.policy.observation_normalizer.state_dict()[name], tensor), name
    obs = np.stack([raw_cartpole().reset(seed=seed)[0] for seed in range(5)])
    assert np.array_equal(model.predict(obs, deterministic=True)[0], loaded.predict(obs, deterministic=True)[0])
    # predict() reads the statistics and leaves them as they are
    before = loaded.policy.observation_normalizer.pending_count.item()
    loaded.predict(obs)
    assert loaded.policy.observation_normalizer.pending_count.item() == before


def test_the_doctor_does_not_read_the_statistics_as_weights(tmp_path: Any) -> None:
    """A mean of 3e9 is the observations' unit, not a weight beyond its limit."""
    model = make_model(PPO, dict(n_steps=32, batch_size=32, n_epochs=1))
    model.learn(3 * 64)
    model.save(tmp_path / "model")
    report = diagnose(tmp_path / "model.zip")
    assert not any("observation_normalizer" in name for name, _ in report.largest)
    assert not report.beyond_limits


@pytest.mark.parametrize(("algo", "kwargs"), FEED_FORWARD[2:])
def test_a_rollback_restores_the_statistics(algo: type, kwargs: dict[str, Any]) -> None:
    """A NaN written into the weights by the 3rd update: the guard restores the state its snapshot took at the start
    of the 3rd rollout, before its first step: the 1st rollout's observations are the statistics and the 2nd's are
    pending (the 3rd's, taken in since, are gone)."""
    model = make_model(algo, kwargs)
    rollout = model.n_steps * model.n_envs
    steps_per_update = 1 if algo is SafeA2C else kwargs["n_epochs"] * (rollout // kwargs["batch_size"])
    NaNAfterOptimizerStep(model.policy.optimizer, 2 * steps_per_update + 1, model.policy.action_net.weight)
    check = RolloutCheck()
    guard = NonFiniteGuardCallback(on_nonfinite="rollback", snapshot_every=1)
    model.learn(3 * rollout, callback=[guard, check])
    assert guard.n_rollbacks == 1 and guard.events[0].healthy["timestep"] == 2 * rollout
    normalizer = model.policy.observation_normalizer
    assert (normalizer.obs_count.item(), normalizer.pending_count.item()) == (rollout, rollout)
    assert normalizer.kept.count == 0
    np.testing.assert_allclose(normalizer.obs_mean.numpy(), check.observations[0].mean(axis=0), rtol=1e-9)
    np.testing.assert_allclose(normalizer.pending_mean.numpy(), check.observations[1].mean(axis=0), rtol=1e-9)


@pytest.mark.parametrize(
    ("policy", "space"),
    [
        (SafeMlpPolicy, spaces.Dict({"a": spaces.Box(-1, 1, (2,))})),
        (SafeMlpPolicy, spaces.Box(0, 255, (36, 36, 3), np.uint8)),
        (SafeMaskableMlpPolicy, spaces.Discrete(4)),
    ],
)
def test_spaces_it_cannot_normalize_are_refused_at_construction(policy: type, space: spaces.Space) -> None:
    with pytest.raises(ValueError, match=r"normalize_observations=True needs a Box observation space"):
        policy(space, spaces.Discrete(2), lambda _: 1e-3, **ON)


@pytest.mark.parametrize("setting", ["yes", 1, None, "True"])
def test_a_setting_other_than_true_false_or_auto_is_refused(setting: Any) -> None:
    with pytest.raises(ValueError, match=r"normalize_observations must be True, False or 'auto', got"):
        SafeMlpPolicy(spaces.Box(-1, 1, (4,)), spaces.Discrete(2), lambda _: 1e-3, normalize_observations=setting)


@pytest.mark.parametrize(
    ("policy", "space", "normalized"),
    [
        (SafeMlpPolicy, spaces.Box(-1, 1, (4,)), True),
        (SafeMaskableMlpPolicy, spaces.Box(-np.inf, np.inf, (3,)), True),
        (SafeMlpPolicy, spaces.Dict({"a": spaces.Box(-1, 1, (2,))}), False),
        (SafeMlpPolicy, spaces.Box(0, 255, (36, 36, 3), np.uint8), False),
        # A float image (normalize_images=False): a CNN reads it whole, not a pixel at a time
        (SafeCnnPolicy, spaces.Box(0.0, 1.0, (3, 36, 36), np.float32), False),
        (SafeMaskableMlpPolicy, spaces.Discrete(4), False),
    ],
)
def test_auto_normalizes_box_observations_that_are_not_images(policy: type, space: spaces.Space, normalized: bool) -> None:
    """The policies' default is SB3's computation (SB3's keys, no hook); ``"auto"`` (the safe algorithms' default)
    normalizes Box observations that are not images (the statistics' keys added to SB3's), leaves others as SB3 leaves
    them; the decision is saved."""
    extra = dict(normalize_images=False) if policy is SafeCnnPolicy else {}
    auto = policy(space, spaces.Discrete(2), lambda _: 1e-3, normalize_observations="auto", **extra)
    default = policy(space, spaces.Discrete(2), lambda _: 1e-3, **extra)
    assert auto.normalize_observations is normalized and default.normalize_observations is False
    assert auto._get_constructor_parameters()["normalize_observations"] is normalized
    added = [key for key in auto.state_dict() if key not in default.state_dict()]
    assert added == ([f"observation_normalizer.{name}" for name in STATISTICS] if normalized else [])
    assert not any(module._forward_pre_hooks for module in default.modules())


@pytest.mark.parametrize(("algo", "default"), [(SafeA2C, False), (KLAdaptivePPO, True)])
@pytest.mark.parametrize(
    ("norm_obs", "setting", "normalized"),
    [(True, None, False), (False, None, None), (True, "auto", False), (False, "auto", True), (True, True, True)],
)
def test_safe_algorithms_leave_it_to_a_vecnormalize_that_normalizes_observations(
    algo: type, default: bool, norm_obs: bool, setting: bool | str | None, normalized: bool | None
) -> None:
    """KLAdaptivePPO's default is "auto", SafeA2C's False (A2C's few-step updates pay for the per-step normalization);
    observations a VecNormalize(norm_obs=True) normalizes are not normalized again by "auto" (saved decided in
    policy_kwargs); one that only normalizes rewards leaves it on; an explicit setting is kept."""
    env = VecNormalize(DummyVecEnv([lambda: gym.make("CartPole-v1")]), norm_obs=norm_obs)
    policy_kwargs = {} if setting is None else dict(normalize_observations=setting)
    model = algo("MlpPolicy", env, n_steps=8, policy_kwargs=policy_kwargs)
    expected = default if normalized is None else normalized
    assert model.policy.normalize_observations is expected
    assert model.policy_kwargs["normalize_observations"] in (expected, "auto")


def test_an_invalid_setting_is_refused_under_vecnormalize_too() -> None:
    """A VecNormalize(norm_obs=True) decides "auto" only: any other string still reaches the policy's check."""
    env = VecNormalize(DummyVecEnv([lambda: gym.make("CartPole-v1")]))
    with pytest.raises(ValueError, match=r"normalize_observations must be True, False or 'auto', got 'yes'"):
        SafeA2C("MlpPolicy", env, policy_kwargs=dict(normalize_observations="yes"))


@pytest.mark.parametrize(("stock", "safe"), [(PPO, KLAdaptivePPO), (A2C, SafeA2C)])
def test_checkpoints_load_with_the_normalization_they_were_trained_with(stock: type, safe: type, tmp_path: Any) -> None:
    """A checkpoint trained on raw observations (a stock one, or from before the setting) loads without the normalizer
    "auto" installs; one trained with it loads it into a model built without; predictions are the saved model's."""
    trained_raw = stock("MlpPolicy", raw_cartpole(), n_steps=8, seed=0)
    trained_raw.learn(16)
    trained_raw.save(tmp_path / "raw")
    continued = safe.load(tmp_path / "raw", env=DummyVecEnv([raw_cartpole]))
    assert not continued.policy.normalize_observations
    obs = np.stack([raw_cartpole().reset(seed=seed)[0] for seed in range(8)])
    assert np.array_equal(continued.predict(obs, deterministic=True)[0], trained_raw.predict(obs, deterministic=True)[0])

    trained_normalized = safe(
        "MlpPolicy", raw_cartpole(), n_steps=8, seed=0, policy_kwargs=dict(normalize_observations="auto")
    )
    trained_normalized.learn(32)
    assert trained_normalized.policy.observation_normalizer.obs_count.item() > 0
    trained_normalized.save(tmp_path / "normalized")
    built_without = safe("MlpPolicy", raw_cartpole(), n_steps=8, policy_kwargs=dict(normalize_observations=False))
    built_without.set_parameters(str(tmp_path / "normalized"))
    assert built_without.policy.normalize_observations
    expected = trained_normalized.predict(obs, deterministic=True)[0]
    assert np.array_equal(built_without.predict(obs, deterministic=True)[0], expected)
    assert np.array_equal(safe.load(tmp_path / "normalized").predict(obs, deterministic=True)[0], expected)


# ----- loud, frozen and exact: what a review found -----


class InfAtStep(gym.Wrapper):
    """CartPole-v1 whose observation at step :attr:`at` has an inf."""

    at = 20

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.steps = 0

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        if self.steps == self.at:
            obs = obs.copy()
            obs[2] = np.inf
        return obs, reward, terminated, truncated, info


@pytest.mark.parametrize("algo", [PPO, A2C, KLAdaptivePPO, SafeA2C])
def test_an_inf_observation_is_named_not_clipped(algo: type) -> None:
    """An inf observation is not clipped into a plausible 10 and dropped silently: learn() raises NonFiniteError
    naming the rollout's observations (stock SB3 raises too); predict() and a forward call outside a rollout pass it on
    as NaN, which the policy's output check names."""
    model = algo(SafeMlpPolicy, InfAtStep(gym.make("CartPole-v1")), n_steps=64, policy_kwargs=ON, seed=0)
    with pytest.raises(NonFiniteError, match=r"observations of the rollout: 0 NaN, 1 inf"):
        model.learn(256)
    obs = np.array([[0.0, 0.0, np.inf, 0.0]], dtype=np.float32)
    with pytest.raises(NonFiniteError, match=r"policy output \w+: \d+ NaN"):
        model.predict(obs)
    with pytest.raises(NonFiniteError, match=r"policy output \w+: \d+ NaN"):
        model.policy(th.as_tensor(obs))


def test_forward_predict_and_evaluation_outside_a_rollout_change_nothing(tmp_path: Any) -> None:
    """After learn(): a forward call (SB3's ONNX export recipe calls it), predict(), evaluate_policy and an
    EvalCallback during training change no statistic; what is saved after them is what was saved before."""
    model = make_model(PPO, dict(n_steps=32, batch_size=32, n_epochs=1))
    evaluations = EvalCallback(DummyVecEnv([raw_cartpole]), eval_freq=20, n_eval_episodes=2, verbose=0)
    check = RolloutCheck()
    model.learn(4 * 64, callback=[evaluations, check])
    assert check.counts == [(0.0, 64), (64, 64), (128, 64), (192, 64)]
    normalizer = model.policy.observation_normalizer
    before = {name: tensor.clone() for name, tensor in normalizer.state_dict().items()}
    obs = np.stack([raw_cartpole().reset(seed=seed)[0] for seed in range(6)])
    predicted = model.predict(obs, deterministic=True)[0]
    model.policy(th.zeros(1, 4), deterministic=True)
    model.policy(th.as_tensor(obs))
    evaluate_policy(model, DummyVecEnv([raw_cartpole]), n_eval_episodes=2)
    assert normalizer.kept.count == 0
    for name, tensor in normalizer.state_dict().items():
        assert th.equal(tensor, before[name]), name
    assert np.array_equal(model.predict(obs, deterministic=True)[0], predicted)
    model.save(tmp_path / "model")
    loaded = PPO.load(tmp_path / "model", device="cpu")
    for name, tensor in loaded.policy.observation_normalizer.state_dict().items():
        assert th.equal(tensor, before[name]), name
    assert np.array_equal(loaded.predict(obs, deterministic=True)[0], predicted)


def test_a_partial_load_keeps_the_trained_normalizer() -> None:
    """``load_state_dict(strict=False)`` / ``set_parameters(exact_match=False)`` of one weight into a policy whose
    "auto" installed a normalizer (KLAdaptivePPO) keep the normalizer and its statistics: predictions unchanged."""
    model = KLAdaptivePPO("MlpPolicy", raw_cartpole(), n_steps=32, batch_size=32, n_epochs=1, seed=0)
    model.learn(96)
    obs = np.stack([raw_cartpole().reset(seed=seed)[0] for seed in range(8)])
    expected = model.policy.predict_values(th.as_tensor(obs)).detach()
    weight = {"value_net.weight": model.policy.value_net.weight.detach().clone()}
    model.policy.load_state_dict(weight, strict=False)
    model.set_parameters({"policy": weight}, exact_match=False)
    assert model.policy.normalize_observations
    assert model.policy.observation_normalizer.obs_count.item() == 64
    assert th.equal(model.policy.predict_values(th.as_tensor(obs)).detach(), expected)


@pytest.mark.parametrize("algo", [PPO, KLAdaptivePPO])
def test_save_load_and_continue_takes_the_statistics_as_continuing_does(algo: type, tmp_path: Any) -> None:
    """A model saved after learn(), loaded and continued has after one more rollout the statistics of the model
    continued in memory (the last rollout's observations are saved as pending, folded in when the next starts)."""
    kwargs = dict(n_steps=32, batch_size=32, n_epochs=1)
    if algo is KLAdaptivePPO:
        kwargs["normalize_value"] = False
    continued = make_model(algo, kwargs, n_envs=1)
    continued.learn(3 * 32)
    continued.save(tmp_path / "model")
    loaded = algo.load(tmp_path / "model", env=continued.get_env(), device="cpu")
    counts = []
    for model in (continued, loaded):
        check = RolloutCheck()
        model.learn(32, reset_num_timesteps=False, callback=check)
        counts.append(check.counts)
    assert counts[0] == counts[1] == [(96.0, 32.0)]
    saved, resumed = continued.policy.observation_normalizer, loaded.policy.observation_normalizer
    for name in ("obs_mean", "obs_var", "obs_count"):
        assert th.equal(getattr(saved, name), getattr(resumed, name)), name


@pytest.mark.parametrize(
    "make",
    [
        lambda env: PPO(SafeMlpPolicy, env, n_steps=16, batch_size=16, n_epochs=1, policy_kwargs=ON),
        lambda env: KLAdaptivePPO("MlpPolicy", env, n_steps=16, batch_size=16, n_epochs=1, policy_kwargs=ON),
    ],
    ids=["PPO+SafeMlpPolicy", "KLAdaptivePPO"],
)
def test_double_normalization_is_named_once(make: Any) -> None:
    """A policy told to normalize, in a VecNormalize(norm_obs=True): one warning naming both, whether the algorithm
    (KLAdaptivePPO's set-up) or a callback (the guard, the adaptive lr, at training start) sees it, however many
    learn() calls; "auto" in a safe algorithm, and a stock algorithm without sb3-safe's callbacks, stay silent."""
    for callbacks in (lambda: [NonFiniteGuardCallback(), KLAdaptiveLRCallback()], lambda: [KLAdaptiveLRCallback()]):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = make(VecNormalize(DummyVecEnv([lambda: gym.make("CartPole-v1")])))
            for _ in range(2):
                model.learn(16, callback=callbacks())
        named = [warning for warning in caught if "normalized twice" in str(warning.message)]
        assert len(named) == 1
        assert "VecNormalize(norm_obs=True)" in str(named[0].message)
        assert "normalize_observations=False" in str(named[0].message)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        auto = KLAdaptivePPO("MlpPolicy", VecNormalize(DummyVecEnv([lambda: gym.make("CartPole-v1")])), n_steps=16)
        auto.learn(16, callback=NonFiniteGuardCallback())
        stock = PPO(SafeMlpPolicy, VecNormalize(DummyVecEnv([lambda: gym.make("CartPole-v1")])), n_steps=16, policy_kwargs=ON)
        stock.learn(16)
    assert not [warning for warning in caught if "normalized twice" in str(warning.message)]


def test_the_count_cannot_saturate() -> None:
    """Float64 statistics: counts far beyond float32's 2**24 add exactly, and the mean still moves."""
    normalizer = ObservationNormalizer((1,))
    normalizer.obs_count.fill_(2.0**40)
    normalizer.pending_mean.fill_(2.0**40)
    normalizer.pending_count.fill_(2.0**40)
    normalizer.commit()
    assert normalizer.obs_count.item() == 2.0**41
    assert normalizer.obs_mean.item() == 2.0**39
    normalizer.observe(th.tensor([[1.0]]))
    normalizer.commit()
    assert normalizer.obs_count.item() == 2.0**41 + 1
