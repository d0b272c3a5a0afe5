"""NormalizedRollout: an update's rollout normalized once, exactly as the policy and the value head normalize it."""

import numpy as np
import pytest
import torch as th
from stable_baselines3.common.callbacks import CallbackList
from stable_baselines3.common.env_util import make_vec_env

from sb3_safe import KLAdaptivePPO
from sb3_safe.common.normalized_rollout import NormalizedRollout
from sb3_safe.common.value_norm import normalized_values, value_head


@pytest.fixture
def model() -> KLAdaptivePPO:
    """KLAdaptivePPO with both normalizations (its defaults on Pendulum-v1), trained twice, a third rollout collected
    and not yet trained on (the buffer in its collection layout)."""
    model = KLAdaptivePPO("MlpPolicy", make_vec_env("Pendulum-v1", n_envs=2, seed=0), n_steps=32, batch_size=16, seed=0)
    model.learn(128)
    assert model.policy.normalize_observations and value_head(model.policy) is not None
    model._setup_learn(10**6, None, reset_num_timesteps=False)
    callback = CallbackList([])
    callback.init_callback(model)
    model.collect_rollouts(model.env, callback, model.rollout_buffer, n_rollout_steps=model.n_steps)
    model.policy.set_training_mode(True)  # as train() does: the rollout's observations wait as pending statistics
    return model


def _expected(model: KLAdaptivePPO, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What the update's losses read, normalized one minibatch at a time as the policy and the head do."""
    head = value_head(model.policy)
    assert head is not None
    return {
        "observations": model.policy.observation_normalizer.normalize(th.tensor(raw["observations"])).numpy(),
        "returns": head.normalize(th.tensor(raw["returns"])).numpy(),
        "values": head.normalize(th.tensor(raw["values"])).numpy(),
        "advantages": head.scale_advantages(th.tensor(raw["advantages"])).numpy(),
    }


NAMES = ("observations", "returns", "values", "advantages")


def test_inside_the_buffer_holds_what_the_losses_read_and_gets_its_raw_arrays_back(model: KLAdaptivePPO) -> None:
    buffer = model.rollout_buffer
    raw = {name: getattr(buffer, name).copy() for name in NAMES}
    expected = _expected(model, raw)
    with NormalizedRollout(model.policy, buffer):
        for name in NAMES:
            np.testing.assert_array_equal(getattr(buffer, name), expected[name], err_msg=name)  # to the bit
        samples = list(buffer.get(16))  # the first get flattens steps x envs into one axis
        assert len(samples) == 4
    assert buffer.generator_ready
    for name in NAMES:
        np.testing.assert_array_equal(getattr(buffer, name), buffer.swap_and_flatten(raw[name]), err_msg=name)


def test_the_policy_takes_the_normalized_rollout_as_it_takes_raw_observations(model: KLAdaptivePPO) -> None:
    buffer = model.rollout_buffer
    observations = th.tensor(buffer.observations.reshape(-1, 3))
    actions = th.tensor(buffer.actions.reshape(-1, 1))
    with th.no_grad(), normalized_values(model.policy):
        expected = model.policy.evaluate_actions(observations, actions)
    with th.no_grad(), NormalizedRollout(model.policy, buffer):
        normalized = th.tensor(buffer.observations.reshape(-1, 3))
        assert not th.equal(normalized, observations)
        found = model.policy.evaluate_actions(normalized, actions)
    for name, want, got in zip(("values", "log_prob", "entropy"), expected, found, strict=True):
        assert th.equal(want, got), name
    # Outside again, the policy normalizes what it receives
    with th.no_grad():
        assert th.equal(model.policy.evaluate_actions(observations, actions)[1], expected[1])


def test_a_statistics_change_inside_the_update_normalizes_the_rollout_anew(model: KLAdaptivePPO) -> None:
    """What a rollback does to the statistics (restores other ones) between two minibatches: the next ones read the
    rollout normalized with the statistics now in force; without a change nothing is normalized again."""
    buffer = model.rollout_buffer
    head = value_head(model.policy)
    assert head is not None
    raw = {name: getattr(buffer, name).copy() for name in NAMES}
    with NormalizedRollout(model.policy, buffer) as normalized:
        next(iter(buffer.get(16)))  # flattened from here on
        unchanged = {name: getattr(buffer, name) for name in NAMES}
        normalized.refresh()
        assert all(getattr(buffer, name) is unchanged[name] for name in NAMES)
        with th.no_grad():
            model.policy.observation_normalizer.obs_mean.add_(0.5)
            head.return_var.mul_(4.0)
        normalized.refresh()
        flat = {name: buffer.swap_and_flatten(array) for name, array in raw.items()}
        expected = _expected(model, flat)
        for name in NAMES:
            np.testing.assert_array_equal(getattr(buffer, name), expected[name], err_msg=name)
    for name in NAMES:
        np.testing.assert_array_equal(getattr(buffer, name), buffer.swap_and_flatten(raw[name]), err_msg=name)


def test_without_normalizations_nothing_is_touched() -> None:
    model = KLAdaptivePPO(
        "MlpPolicy",
        make_vec_env("CartPole-v1", n_envs=2, seed=0),
        n_steps=16,
        batch_size=16,
        normalize_value=False,
        policy_kwargs=dict(normalize_observations=False),
        seed=0,
    )
    model.learn(32)
    arrays = {name: getattr(model.rollout_buffer, name) for name in NAMES}
    with NormalizedRollout(model.policy, model.rollout_buffer):
        assert all(getattr(model.rollout_buffer, name) is arrays[name] for name in NAMES)
