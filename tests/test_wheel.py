"""
The wheel as users get it: built from the sources, installed (not editable) with ``[zoo]`` into a fresh virtual
environment, and run as ``sb3-safe`` from a folder outside the repository.

The fresh environment sees the dependencies already installed for the suite (through a ``.pth`` file naming a
folder of links to them), so pip resolves ``sb3-safe[zoo]`` against them offline and installs only the wheel. That
folder leaves out the suite's own editable sb3-safe (its metadata and its import finder), so the ``sb3_safe``
imported there can only be the wheel's.
"""

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

import sb3_safe

ROOT = Path(__file__).resolve().parent.parent


def _run(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(command)}\n{result.stdout}\n{result.stderr}"
    return result


def _dependencies_without_sb3_safe(folder: Path) -> Path:
    # Links to everything installed for the suite but sb3-safe itself (an editable install here)
    site_packages = Path(sysconfig.get_path("purelib"))
    folder.mkdir()
    for entry in site_packages.iterdir():
        if not entry.name.startswith(("sb3_safe", "__editable__")):
            (folder / entry.name).symlink_to(entry)
    return folder


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """The fresh environment's ``bin`` folder with the wheel installed, and the environment variables to run it."""
    tmp = tmp_path_factory.mktemp("wheel")
    # No pip configuration (local indexes, find-links, constraints), no PYTHONPATH: only what is named here
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PIP_", "PYTHON"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    # What the wheel is built from: pyproject.toml reads the README, the package data lies inside sb3_safe
    (tmp / "src").mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tmp / "src")
    shutil.copytree(ROOT / "sb3_safe", tmp / "src" / "sb3_safe", ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip"]
    _run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(tmp / "dist"), "./src"], tmp, env)
    (wheel,) = (tmp / "dist").glob("sb3_safe-*.whl")

    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp, env)
    python = venv / "bin" / "python"
    purelib = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], tmp, env).stdout.strip()
    # A .pth line is appended to sys.path after the environment's own site-packages, where the wheel goes
    (Path(purelib) / "suite_dependencies.pth").write_text(f"{_dependencies_without_sb3_safe(tmp / 'dependencies')}\n")
    result = _run([*pip, "--python", str(python), "install", "--no-index", f"sb3-safe[zoo] @ {wheel.as_uri()}"], tmp, env)
    # pip found every dependency of [zoo] installed and added nothing but the wheel
    assert "Requirement already satisfied: rl_zoo3" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == f"Successfully installed sb3-safe-{sb3_safe.__version__}"
    return venv / "bin", env


def test_installed_wheel_is_the_one_imported(installed: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    bin_folder, env = installed
    code = "import sb3_safe, sb3_safe.zoo; print(sb3_safe.__file__); print(sb3_safe.zoo.CONFIG_DIR)"
    package, config_dir = _run([str(bin_folder / "python"), "-c", code], tmp_path, env).stdout.splitlines()
    assert Path(package).is_relative_to(bin_folder.parent) and not Path(package).is_relative_to(ROOT)
    assert sorted(path.name for path in Path(config_dir).glob("*.yml")) == sorted(
        path.name for path in (ROOT / "sb3_safe" / "zoo_configs").glob("*.yml")
    )


@pytest.mark.parametrize(("algo", "env_id"), [("kl_ppo", "CartPole-v1"), ("ppo_lstm", "CartPoleNoVel-v1")])
def test_train_with_packaged_config_then_doctor(
    installed: tuple[Path, dict[str, str]], tmp_path: Path, algo: str, env_id: str
) -> None:
    # One rollout (8 envs x 32 steps in both packaged entries), from a folder that is not the repository
    bin_folder, env = installed
    sb3_safe_command = str(bin_folder / "sb3-safe")
    train = [sb3_safe_command, "train", "--algo", algo, "--env", env_id, "-n", "256", "--seed", "0"]
    train += ["--eval-freq", "-1", "--eval-episodes", "2", "--num-threads", "1"]
    lines = _run(train, tmp_path, env).stdout.splitlines()
    model = tmp_path / "logs" / algo / f"{env_id}_1" / f"{env_id}.zip"
    assert f"saved model: {model.relative_to(tmp_path)}" in lines
    # rl_zoo3 saves its arguments: the configuration file is the one packaged in the installed wheel
    args = yaml.load((model.parent / env_id / "args.yml").read_text(), Loader=yaml.UnsafeLoader)  # written by this test
    conf_file = Path(args["conf_file"])
    assert conf_file.name == f"{algo}.yml" and conf_file.is_relative_to(bin_folder.parent)
    # and the run's first line said so
    assert lines[0] == f"sb3-safe train: configuration {conf_file} (packaged), entry '{env_id}'; guard on (rollback)"
    result = _run([sb3_safe_command, "doctor", str(model)], tmp_path, env)
    assert "Healthy" in result.stdout
