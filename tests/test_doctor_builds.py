"""
One verdict, up to the building of the model: ``sb3-safe doctor`` builds the model a file describes as
``sb3_safe.load`` builds it (:mod:`sb3_safe.loading.building`), so a file doctor calls healthy loads, and a file whose
model SB3 cannot build, or not within the limits of building, is refused by both for the same cause, at a bounded
cost (a network or a space of a billion values described in a file of 50 KiB).
"""

import contextlib
import io
import pickle
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from sb3_contrib import MaskablePPO
from sb3_contrib.common.envs import InvalidActionEnvDiscrete
from stable_baselines3 import A2C, DDPG, PPO
from stable_baselines3.common.base_class import BaseAlgorithm
from test_secure_load_real_models import ALL_MODELS

import sb3_safe
from sb3_safe.cli import main
from sb3_safe.doctor import EXIT_HEALTHY, EXIT_UNREADABLE, SizeLimits, diagnose
from sb3_safe.loading.building import BUILD_REFUSAL
from tests.zip_builders import rewrite_zip, serialized, torch_bytes

#: Peak memory growth allowed to either reader of a crafted file (the models themselves are a few KiB)
MAX_GROWTH_MIB = 200
#: Seconds allowed to either reader of a crafted file, on a loaded 2-core machine
MAX_SECONDS = 10.0


class TrustedActivation(th.nn.Tanh):
    """An activation of the user's own: doctor does not import its module, even trusted."""


@pytest.fixture(scope="module")
def ppo_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ppo") / "ppo.zip"
    PPO("MlpPolicy", "CartPole-v1", n_steps=16, batch_size=16, n_epochs=1).save(path)
    return path


def _peak_kib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM"))


@contextlib.contextmanager
def _bounded() -> Iterator[None]:
    """The block grows the peak resident memory by at most MAX_GROWTH_MIB and takes at most MAX_SECONDS."""
    if sys.platform == "linux":
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # resets VmHWM to the current resident size
        before = _peak_kib()
    start = time.perf_counter()
    yield
    assert time.perf_counter() - start < MAX_SECONDS
    if sys.platform == "linux":
        assert (_peak_kib() - before) / 1024 < MAX_GROWTH_MIB


def _doctor(path: Path, capsys: pytest.CaptureFixture, *options: str) -> tuple[int, str, str]:
    """doctor's exit status, report and cause (its one line on stderr, without the file's name)."""
    with _bounded():
        status = main(["doctor", *options, str(path)])
    captured = capsys.readouterr()
    cause = captured.err.strip().removeprefix("sb3-safe doctor: error: ").removeprefix(f"{path}: ")
    return status, captured.out, cause


def _refusal(algorithm: type[BaseAlgorithm], path: Path, **kwargs: Any) -> str:
    with _bounded(), pytest.raises(sb3_safe.RefusedFileError) as refused:
        sb3_safe.load(algorithm, path, **kwargs)
    return str(refused.value)


def _assert_one_cause(
    path: Path,
    capsys: pytest.CaptureFixture,
    expected: str,
    algorithm: type[BaseAlgorithm] = PPO,
    max_total_mb: int | None = None,
) -> None:
    """doctor exits 2 with one line naming ``expected``, and load refuses the file for that same cause."""
    options = () if max_total_mb is None else ("--max-total-mb", str(max_total_mb))
    status, _, cause = _doctor(path, capsys, *options)
    assert status == EXIT_UNREADABLE and expected in cause and "\n" not in cause
    limits = None if max_total_mb is None else SizeLimits(total=max_total_mb * 2**20)
    assert f"{path}: refused: {cause}; inspect it with: sb3-safe doctor" in _refusal(algorithm, path, limits=limits)


def _with_item(source: Path, target: Path, key: str, value: Any) -> Path:
    """The model zip ``source`` with ``data[key]`` pickled as SB3 pickles an item."""

    def change(data: dict[str, Any]) -> dict[str, Any]:
        data[key] = serialized(pickle.dumps(value))
        return data

    return rewrite_zip(source, target, change)


@pytest.mark.parametrize("algorithm", [PPO, A2C])
def test_a_real_model_is_healthy_builds_and_loads(
    algorithm: type[BaseAlgorithm], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    model = algorithm("MlpPolicy", "CartPole-v1", n_steps=64)
    model.save(tmp_path / "model.zip")
    status, out, _ = _doctor(tmp_path / "model.zip", capsys)
    parameters = sum(parameter.numel() for parameter in model.policy.parameters())
    assert status == EXIT_HEALTHY
    assert f"Builds: {algorithm.__name__}.load builds the model it describes, as sb3_safe.load does ({parameters} " in out
    assert diagnose(tmp_path / "model.zip").to_dict()["built"] == {"algorithm": algorithm.__name__, "parameters": parameters}
    loaded = sb3_safe.load(algorithm, tmp_path / "model.zip")
    assert all(th.equal(model.policy.state_dict()[key], value) for key, value in loaded.policy.state_dict().items())


@pytest.mark.parametrize("name", ALL_MODELS)
def test_doctor_builds_as_the_algorithm_that_saved_the_file(name: str, tmp_path: Path) -> None:
    model, _ = ALL_MODELS[name]()
    model.save(tmp_path / "model.zip")
    # DDPG is TD3 with other defaults: its files save TD3's attributes, and TD3 builds them alike
    expected = "TD3" if type(model) is DDPG else type(model).__name__
    assert diagnose(tmp_path / "model.zip").built == expected


def test_tensors_that_do_not_fit_the_policy_are_refused_by_both_for_one_cause(
    ppo_zip: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    with zipfile.ZipFile(ppo_zip) as archive:
        state_dict = th.load(io.BytesIO(archive.read("policy.pth")), weights_only=True)
    state_dict["action_net.weight"] = th.zeros(2, 65)
    path = rewrite_zip(ppo_zip, tmp_path / "mismatch.zip", replace={"policy.pth": torch_bytes(state_dict)})
    _assert_one_cause(path, capsys, f"{BUILD_REFUSAL} (RuntimeError: Error(s) in loading state_dict for ActorCriticPolicy:")
    _, _, cause = _doctor(path, capsys)
    assert "size mismatch for action_net.weight" in cause


def test_a_huge_network_is_refused_by_both_before_it_is_allocated(
    ppo_zip: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # 10^12 weights (4 TB) described in a file of 50 KiB
    path = _with_item(ppo_zip, tmp_path / "huge.zip", "policy_kwargs", {"net_arch": [10**6, 10**6]})
    _assert_one_cause(path, capsys, "the model it describes would have tensors of more than 4.1 MiB, twice the file's")
    # Where the budget is the lower limit, the refusal names it and its option
    _assert_one_cause(path, capsys, "would have tensors of more than the file's budget of 1.0 MiB (--max-total-mb", PPO, 1)


def test_a_huge_observation_space_is_refused_by_both(ppo_zip: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # A space's pickle sets its shape (gymnasium's Box builds no array of that size): 10^7 observations per step
    space = spaces.Box(-1.0, 1.0, (4,), np.float32)
    space._shape = (10**7,)
    path = _with_item(ppo_zip, tmp_path / "space.zip", "observation_space", space)
    _assert_one_cause(path, capsys, "the model it describes would have tensors of more than")


def test_action_masks_beyond_the_budget_are_refused_by_both(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    env = InvalidActionEnvDiscrete(dim=10, n_invalid_actions=3)
    MaskablePPO("MlpPolicy", env, n_steps=64, batch_size=64).save(tmp_path / "maskable.zip")
    # 2^25 steps of 10 masks: 1.25 GiB of float32 ones, which the buffer fills (its other arrays are zeros numpy only
    # reserves)
    path = rewrite_zip(tmp_path / "maskable.zip", tmp_path / "masks.zip", lambda data: {**data, "n_steps": 2**25})
    _assert_one_cause(path, capsys, "would fill buffers of more than the file's budget of 1024.0 MiB", MaskablePPO)


def test_a_space_of_objects_is_refused_by_both(ppo_zip: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    space = spaces.Box(-1.0, 1.0, (4,), np.float32)
    space.dtype = np.dtype(object)
    path = _with_item(ppo_zip, tmp_path / "objects.zip", "observation_space", space)
    _assert_one_cause(path, capsys, "a Box space of dtype object, not of numbers")


def test_an_environment_in_data_is_refused_by_both(ppo_zip: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # SB3's load makes the environment its data names: gym.make of an id the file chooses
    path = rewrite_zip(ppo_zip, tmp_path / "env.zip", lambda data: {**data, "env": "CartPole-v1"})
    _assert_one_cause(path, capsys, 'data["env"]: an environment, which SB3 never saves')


def test_doctor_says_why_it_did_not_build(ppo_zip: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = _with_item(ppo_zip, tmp_path / "trusted.zip", "policy_kwargs", {"activation_fn": TrustedActivation})
    status, out, _ = _doctor(path, capsys, "--trust", TrustedActivation.__module__)
    assert status == EXIT_HEALTHY
    assert 'Not built: data["policy_kwargs"] names a module you trust, which doctor does not import' in out
    assert "Builds:" not in out


def test_doctor_builds_as_the_algorithm_it_is_given(ppo_zip: Path, capsys: pytest.CaptureFixture) -> None:
    status, out, _ = _doctor(ppo_zip, capsys, "--algo", "KLAdaptivePPO")
    assert status == EXIT_HEALTHY and "Builds: KLAdaptivePPO.load builds the model it describes" in out
