"""Each example runs to the end at its small budget (``--timesteps``) and writes what it announces."""

import os
import subprocess
import sys
from pathlib import Path

from sb3_safe import KLAdaptivePPO, SafeA2C

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(name: str, output: Path, *args: str) -> list[str]:
    # In the output folder: MuJoCo writes its warnings to MUJOCO_LOG.TXT in the working directory
    command = [sys.executable, str(EXAMPLES / name), "--output", str(output), *args]
    # One torch thread, as conftest.py sets in-process: threads fighting over 2 cores slow small networks ~5x
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, cwd=output, env=env)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result.stdout.splitlines()


def test_quickstart(tmp_path: Path) -> None:
    lines = run_example("quickstart.py", tmp_path, "--timesteps", "2000")
    assert lines[-3] == f"saved model: {tmp_path / 'ppo_safe_cartpole.zip'}"
    assert lines[-2] == f"saved learning curve: {tmp_path / 'learning_curve.png'}"
    assert lines[-1].startswith("evaluation over 10 episodes: mean return ")
    assert (tmp_path / "learning_curve.png").stat().st_size > 0


def test_rescue(tmp_path: Path) -> None:
    lines = run_example("rescue.py", tmp_path, "--timesteps", "1000")
    text = "\n".join(lines)
    # 1. stock A2C crashes as reported
    assert "stock A2C: ValueError: Expected parameter scale (Tensor of shape (1, 4)) of distribution Normal" in text
    # 2. the guard names the tensors and rolls back to its last full check (the start) with a halved learning rate,
    # with which training goes on to the end
    assert "policy.log_std: 4 NaN, 0 inf of 4" in text
    assert "guard: actions ['rollback'], learning rate now 1.5" in text
    assert "guard: training ran to the end" in text
    # 3. the safe policy trains to the end with its log-std inside the bounds
    prefix = "SafeMlpPolicy: trained 1000 steps, 0 guard events, log-std parameter in ["
    assert lines[-2].startswith(prefix) and lines[-2].endswith("] (bounds [-20, 2])")
    low, high = (float(value) for value in lines[-2][len(prefix) :].split("]")[0].split(", "))
    assert -20.0 <= low <= high <= 2.0
    # At learning rate 3 the direction the log-std takes depends on the CPU's float kernels (one CI machine never
    # reached a bound, this one collapses at -20): the exploration report names the lower bound when it fires
    # (its wording is tested exactly in test_guard.py)
    assert lines[-1] == "guard: exploration never sat at a bound" or lines[-1].startswith(
        "guard: exploration collapsed at log_std = -20 (std 2.06e-09) in "
    )


def test_hopper_kl_ppo(tmp_path: Path) -> None:
    lines = run_example("hopper_kl_ppo.py", tmp_path, "--timesteps", "1024")
    assert lines[0] == "       0 steps: beta 1"
    assert lines[-3] == f"saved model: {tmp_path / 'kl_ppo_hopper.zip'}"
    assert lines[-2] == f"saved VecNormalize statistics: {tmp_path / 'vecnormalize.pkl'}"
    assert lines[-1].startswith("evaluation over 5 episodes: mean return ")
    model = KLAdaptivePPO.load(tmp_path / "kl_ppo_hopper.zip", device="cpu")
    assert model.num_timesteps == 1024
    # beta was adapted after each of the two updates: by factors of 2 from 1, inside its bounds
    assert model.kl_beta in (0.25, 0.5, 1.0, 2.0, 4.0)


def test_pong_safe_a2c(tmp_path: Path) -> None:
    lines = run_example("pong_safe_a2c.py", tmp_path, "--timesteps", "80", "--eval-episodes", "1")
    model_path = tmp_path / "safe_a2c" / "PongNoFrameskip-v4_1" / "PongNoFrameskip-v4.zip"
    assert lines[-3] == f"saved model: {model_path}"
    assert lines[-2] == "learning curve: none (no training episode finished)"
    # A Pong game ends at 21 points: the score of an untrained agent is between -21 and 21
    assert lines[-1].startswith("evaluation over 1 episodes (stochastic): mean return ")
    score = float(lines[-1].split("mean return ")[1].split(" +/- ")[0])
    assert -21.0 <= score <= 21.0
    model = SafeA2C.load(model_path, device="cpu")
    assert model.num_timesteps == 80 and model.n_envs == 16
