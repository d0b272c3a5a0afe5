"""
The `sb3-safe` command as a new user meets it, through the installed entry point: bad input is one line on stderr
and exit status 2, with no traceback and no folder left behind; doctor finds a model without `.zip` as SB3's `load`
does; every algorithm with a packaged configuration trains with it by default, and the run's first line says so.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from stable_baselines3 import PPO

from sb3_safe.zoo import CONFIG_DIR, PACKAGED_BY_DEFAULT
from sb3_safe.zoo.configuration import rl_zoo3_config

SB3_SAFE = str(Path(sys.executable).parent / "sb3-safe")
# One torch thread: small networks on shared cores
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
TIMEOUT = 300
#: an environment of each packaged configuration's own entries
ENVS = {"ppo_lstm": "CartPoleNoVel-v1"}


def sb3_safe(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SB3_SAFE, *args], cwd=cwd, env=env or ENV, capture_output=True, text=True, timeout=TIMEOUT, check=False
    )


def assert_one_line_usage_error(result: subprocess.CompletedProcess[str], command: str, fragment: str) -> str:
    """Exit status 2, one line on stderr naming the command and the problem, no traceback."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith(f"sb3-safe {command}: error: "), lines[0]
    assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def model_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "model.zip"
    PPO("MlpPolicy", "CartPole-v1", n_steps=16, batch_size=16, n_epochs=1, policy_kwargs=dict(net_arch=[8])).save(path)
    return path


def test_enjoy_of_a_model_that_is_not_a_zip(tmp_path: Path) -> None:
    run = tmp_path / "logs" / "ppo" / "CartPole-v1_1"
    run.mkdir(parents=True)
    (run / "CartPole-v1.zip").write_text("not a model")
    result = sb3_safe("enjoy", "--algo", "ppo", "--env", "CartPole-v1", "-f", "logs", "--no-render", "-n", "10", cwd=tmp_path)
    assert_one_line_usage_error(result, "enjoy", "CartPole-v1.zip: refused: not a zip archive, so not a saved SB3 model")


def test_train_continuing_a_file_that_is_not_a_model(tmp_path: Path) -> None:
    (tmp_path / "text.zip").write_text("not a model")
    result = sb3_safe("train", "--algo", "ppo", "--env", "CartPole-v1", "-n", "64", "-i", "text.zip", cwd=tmp_path)
    line = assert_one_line_usage_error(result, "train", "text.zip: refused: not a zip archive")
    assert "bad configuration" not in line
    # rl_zoo3 created logs/ppo/ and the run folder before it loaded the model: all gone, enjoy would look there
    assert not (tmp_path / "logs").exists()


def test_a_failed_run_leaves_no_folder_and_keeps_existing_ones(tmp_path: Path) -> None:
    bad_value = ["--hyperparams", "n_epochs:'twenty'"]
    result = sb3_safe("train", "--algo", "ppo", "--env", "CartPole-v1", "-n", "64", *bad_value, cwd=tmp_path)
    assert_one_line_usage_error(result, "train", "config value n_epochs: 'twenty' is a str")
    assert not (tmp_path / "logs").exists()
    # A log folder of the user's stays, also when empty
    (tmp_path / "mine").mkdir()
    result = sb3_safe("train", "--algo", "ppo", "--env", "CartPole-v1", "-n", "64", "-f", "mine", *bad_value, cwd=tmp_path)
    assert result.returncode == 2
    assert [path.name for path in tmp_path.iterdir()] == ["mine"] and not list((tmp_path / "mine").iterdir())


def test_an_environment_whose_package_is_missing(tmp_path: Path) -> None:
    # As gymnasium's Box2D and MuJoCo ids without their extra: the id is registered, its module does not import
    (tmp_path / "my_envs.py").write_text(
        "import gymnasium\ngymnasium.register('Missing-v0', entry_point='not_installed_package.envs:MissingEnv')\n"
    )
    env = {**ENV, "PYTHONPATH": str(tmp_path)}
    args = ["train", "--algo", "ppo", "--env", "Missing-v0", "--gym-packages", "my_envs", "-n", "64"]
    result = sb3_safe(*args, cwd=tmp_path, env=env)
    assert_one_line_usage_error(result, "train", "environment Missing-v0: No module named 'not_installed_package'")
    assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize("suffix", ["", ".zip"])
def test_doctor_finds_the_model_as_sb3_load_does(suffix: str, model_zip: Path) -> None:
    path = str(model_zip.with_suffix(""))
    assert not Path(path).exists()
    result = sb3_safe("doctor", path + suffix, cwd=model_zip.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith(f"{model_zip} (")
    assert "Healthy" in result.stdout


def test_doctor_of_an_rl_zoo3_run_without_zip(model_zip: Path, tmp_path: Path) -> None:
    # rl_zoo3 saves <env>.zip next to a folder <env> (config.yml, vecnormalize.pkl): the name without .zip is that folder
    run = tmp_path / "logs" / "ppo" / "CartPole-v1_1"
    (run / "CartPole-v1").mkdir(parents=True)
    (run / "CartPole-v1.zip").write_bytes(model_zip.read_bytes())
    result = sb3_safe("doctor", "logs/ppo/CartPole-v1_1/CartPole-v1", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("logs/ppo/CartPole-v1_1/CartPole-v1.zip (")


def test_doctor_of_a_missing_model_is_one_line(tmp_path: Path) -> None:
    result = sb3_safe("doctor", "nothing", cwd=tmp_path)
    assert result.returncode == 2 and result.stderr == "sb3-safe doctor: error: nothing: no such file\n"


def test_every_packaged_configuration_is_the_default() -> None:
    assert set(PACKAGED_BY_DEFAULT) == {"kl_ppo", "safe_a2c", "ppo", "a2c", "ppo_lstm"}
    assert tuple(sorted(path.stem for path in CONFIG_DIR.glob("*.yml"))) == PACKAGED_BY_DEFAULT


@pytest.mark.parametrize("algo", PACKAGED_BY_DEFAULT)
def test_train_uses_the_packaged_configuration_and_says_so(algo: str, tmp_path: Path) -> None:
    env_id = ENVS.get(algo, "CartPole-v1")
    args = ["train", "--algo", algo, "--env", env_id, "-n", "64", "--eval-freq", "-1", "--no-report", "--seed", "0"]
    if algo != "ppo":
        # Stopped by a bad value after the first line, before training: one run (ppo's, below) shows the rest
        args += ["--hyperparams", "gamma:'high'"]
    result = sb3_safe(*args, cwd=tmp_path)
    assert result.returncode == (0 if algo == "ppo" else 2), result.stderr[-3000:]
    config = CONFIG_DIR / f"{algo}.yml"
    first = result.stdout.splitlines()[0]
    assert first == f"sb3-safe train: configuration {config} (packaged), entry '{env_id}'; guard on (rollback)"
    if algo != "ppo":
        return
    # What rl_zoo3 trained with: the packaged file, its safe policy and the guard
    run = tmp_path / "logs" / algo / f"{env_id}_1" / env_id
    assert str(config) in (run / "args.yml").read_text()
    saved = dict(yaml.load((run / "config.yml").read_text(), Loader=yaml.UnsafeLoader))
    assert saved["policy"] == "sb3_safe.SafeMlpPolicy"
    assert saved["callback"] == [{"sb3_safe.NonFiniteGuardCallback": {"on_nonfinite": "rollback"}}]


def test_first_line_for_rl_zoo3_configuration_and_a_file_of_your_own(tmp_path: Path) -> None:
    # Stopped by a bad value after the first line: no training needed to see it
    bad = ["--hyperparams", "gamma:'high'", "-n", "64"]
    result = sb3_safe("train", "--algo", "sac", "--env", "Pendulum-v1", *bad, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout.splitlines()[0] == (
        f"sb3-safe train: configuration {rl_zoo3_config('sac')} (rl_zoo3's), entry 'Pendulum-v1'; "
        "guard off (add sb3_safe.NonFiniteGuardCallback to the entry's callback)"
    )
    mine = tmp_path / "mine.yml"
    mine.write_text(
        "CartPole-v1:\n  n_timesteps: 64\n  policy: MlpPolicy\n  adaptive_lr: {}\n  callback:\n"
        "    - sb3_safe.NonFiniteGuardCallback:\n        on_nonfinite: stop\n"
    )
    result = sb3_safe("train", "--algo", "kl_ppo", "--env", "CartPole-v1", "--conf-file", "mine.yml", *bad, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout.splitlines()[0] == (
        "sb3-safe train: configuration mine.yml (yours), entry 'CartPole-v1'; guard on (stop), adaptive learning rate on"
    )
    # A task the packaged file has no entry for: its default entry, and where rl_zoo3's tuned entry is
    result = sb3_safe("train", "--algo", "ppo", "--env", "Hopper-v4", *bad, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout.splitlines()[0] == (
        f"sb3-safe train: configuration {CONFIG_DIR / 'ppo.yml'} (packaged), entry 'default' (rl_zoo3 tunes Hopper-v4, "
        f"without the guard: --conf-file {rl_zoo3_config('ppo')}); guard on (rollback)"
    )
