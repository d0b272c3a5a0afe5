"""
The models ``sb3-safe train`` and rl_zoo3's own ``train`` save load with ``sb3_safe.load`` as SB3 loads them;
``sb3-safe enjoy`` and ``sb3-safe train -i`` load through it: a real run as before, a booby-trapped model or
``vecnormalize.pkl`` refused with one line on stderr and exit 2, the payload never run.
"""

import os
import pickle
import shutil
import sys
from pathlib import Path

import gymnasium as gym
import pytest
import rl_zoo3.train
from stable_baselines3 import A2C
from stable_baselines3.common.vec_env import DummyVecEnv
from test_secure_load_real_models import assert_same_model, secure_load
from zip_builders import Reduce, rewrite_zip, serialized, shell_command

import sb3_safe
from sb3_safe.cli import EXIT_USAGE, main

SYSTEM = f"{os.system.__module__}.system"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A kl_ppo run of ``sb3-safe train``, an a2c run of rl_zoo3's own train (VecNormalize, lin_ schedule, gSDE)."""
    folder = tmp_path_factory.mktemp("zoo")
    common = ["--seed", "1", "--num-threads", "1", "-f", str(folder)]
    assert main(["train", "--algo", "kl_ppo", "--env", "CartPole-v1", "-n", "256", "--no-report", *common]) == 0
    saved_argv = sys.argv
    sys.argv = ["rl_zoo3.train", "--algo", "a2c", "--env", "Pendulum-v1", "-n", "128", *common]
    try:
        rl_zoo3.train.train()
    finally:
        sys.argv = saved_argv
    return {"kl_ppo": folder / "kl_ppo" / "CartPole-v1_1", "a2c": folder / "a2c" / "Pendulum-v1_1", "folder": folder}


def test_trained_models_load_as_sb3_loads_them(runs: dict[str, Path]) -> None:
    for algo, env_id in (("kl_ppo", "CartPole-v1"), ("a2c", "Pendulum-v1")):
        path = runs[algo] / f"{env_id}.zip"
        algorithm = sb3_safe.KLAdaptivePPO if algo == "kl_ppo" else A2C
        assert_same_model(algorithm.load(path, device="cpu"), secure_load(algorithm, path, device="cpu"))
    # rl_zoo3's run: its statistics too, and training continues on them
    env = sb3_safe.load_vec_normalize(
        runs["a2c"] / "Pendulum-v1" / "vecnormalize.pkl", DummyVecEnv([lambda: gym.make("Pendulum-v1")])
    )
    model = secure_load(A2C, runs["a2c"] / "Pendulum-v1.zip", env=env, device="cpu")
    assert type(model.lr_schedule).__name__ == "FloatSchedule" and model.learning_rate.__module__ == "rl_zoo3.utils"
    model.learn(16, reset_num_timesteps=False)
    assert model.num_timesteps == 128 + 16


def _copy(runs: dict[str, Path], tmp_path: Path) -> Path:
    folder = tmp_path / "logs"
    shutil.copytree(runs["folder"], folder)
    return folder


def _one_line(capsys: pytest.CaptureFixture) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert "Traceback" not in lines[0]
    return lines[0]


def _enjoy(folder: Path, algo: str, env_id: str, *args: str) -> int:
    return main(["enjoy", "--algo", algo, "--env", env_id, "-f", str(folder), "--no-render", "-n", "20", *args])


def test_enjoy_runs_a_real_model_as_before(runs: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    capsys.readouterr()
    assert _enjoy(runs["folder"], "kl_ppo", "CartPole-v1") == 0
    assert f"Loading {runs['kl_ppo'] / 'CartPole-v1.zip'}" in capsys.readouterr().out
    assert _enjoy(runs["folder"], "a2c", "Pendulum-v1") == 0  # with its VecNormalize statistics
    assert "Loading running average" in capsys.readouterr().out


def test_enjoy_refuses_a_booby_trapped_model(runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = _copy(runs, tmp_path)
    canary = tmp_path / "canary"
    model = folder / "kl_ppo" / "CartPole-v1_1" / "CartPole-v1.zip"
    trap = serialized(pickle.dumps(Reduce(os.system, shell_command(canary))))
    rewrite_zip(runs["kl_ppo"] / "CartPole-v1.zip", model, data=lambda data: data | {"policy_class": trap})
    capsys.readouterr()
    assert _enjoy(folder, "kl_ppo", "CartPole-v1") == EXIT_USAGE
    line = _one_line(capsys)
    assert line == (
        f"sb3-safe enjoy: error: {model}: refused: loading it would run code from {SYSTEM} "
        f'(data["policy_class"]: the pickle calls it); inspect it with: sb3-safe doctor {model}'
    )
    assert not canary.exists()  # os.system runs its command before returning


def test_enjoy_refuses_booby_trapped_statistics(runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = _copy(runs, tmp_path)
    canary = tmp_path / "canary"
    statistics = folder / "a2c" / "Pendulum-v1_1" / "Pendulum-v1" / "vecnormalize.pkl"
    statistics.write_bytes(pickle.dumps(Reduce(os.system, shell_command(canary))))
    capsys.readouterr()
    assert _enjoy(folder, "a2c", "Pendulum-v1") == EXIT_USAGE
    assert f"{statistics}: refused: loading it would run code from {SYSTEM} (vecnormalize.pkl: " in _one_line(capsys)
    assert not canary.exists()


def test_a_class_of_your_own_needs_trust(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model naming the user's module: refused with the way to trust it; --trust MODULE loads it."""
    (tmp_path / "my_project.py").write_text("class Marker:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    pickled = b"\x80\x02cmy_project\nMarker\n."  # GLOBAL my_project.Marker
    folder = _copy(runs, tmp_path)
    model = folder / "kl_ppo" / "CartPole-v1_1" / "CartPole-v1.zip"
    rewrite_zip(runs["kl_ppo"] / "CartPole-v1.zip", model, data=lambda data: data | {"marker": serialized(pickled)})
    capsys.readouterr()
    assert _enjoy(folder, "kl_ppo", "CartPole-v1") == EXIT_USAGE
    line = _one_line(capsys)
    assert 'my_project.Marker (data["marker"]: the pickle imports it, for SB3 to call)' in line
    assert "trust its module (trust=, sb3-safe's --trust MODULE)" in line
    assert "my_project" not in sys.modules  # refused before anything was imported
    assert _enjoy(folder, "kl_ppo", "CartPole-v1", "--trust", "my_project") == 0
    sys.modules.pop("my_project")


def test_train_continues_a_real_model_and_refuses_a_trapped_one(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    folder = _copy(runs, tmp_path)
    model = folder / "a2c" / "Pendulum-v1_1" / "Pendulum-v1.zip"
    common = ["--algo", "a2c", "--env", "Pendulum-v1", "-n", "64", "--no-report", "--seed", "2", "-f", str(folder)]
    assert main(["train", *common, "-i", str(model)]) == 0
    assert "Loading pretrained agent" in capsys.readouterr().out
    assert (folder / "a2c" / "Pendulum-v1_2" / "Pendulum-v1.zip").is_file()

    canary = tmp_path / "canary"
    trap = serialized(pickle.dumps(Reduce(os.system, shell_command(canary))))
    rewrite_zip(runs["a2c"] / "Pendulum-v1.zip", model, data=lambda data: data | {"observation_space": trap})
    capsys.readouterr()
    assert main(["train", *common, "-i", str(model)]) == EXIT_USAGE
    assert _one_line(capsys).startswith(f"sb3-safe train: error: {model}: refused: loading it would run code from {SYSTEM}")
    assert not canary.exists()
    assert not (folder / "a2c" / "Pendulum-v1_3").exists()  # the run folder of the refused setup is removed
