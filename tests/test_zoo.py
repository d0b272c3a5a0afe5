"""
sb3-safe in rl_zoo3: the packaged zoo configurations (schema, rl-zoo provenance, every entry trained through
rl_zoo3 for one update), the registration of the algorithms and the optuna samplers, and the package data of
a non-editable install.
"""

import argparse
import importlib.util
import inspect
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import optuna
import pytest
import rl_zoo3
import yaml
from rl_zoo3 import ALGOS
from rl_zoo3.exp_manager import ExperimentManager
from rl_zoo3.hyperparams_opt import HYPERPARAMS_CONVERTER, HYPERPARAMS_SAMPLER
from stable_baselines3 import A2C, PPO
from torch import nn
from zoo_entries import assert_policy_default_observations, vec_normalize_normalizes_observations

from sb3_safe import KLAdaptivePPO, SafeA2C
from sb3_safe.common.policies import SafeActorCriticPolicy, SafeCnnPolicy
from sb3_safe.zoo import (
    CONFIG_DIR,
    ZooUsageError,
    check_config_file,
    check_hyperparam_types,
    config_path,
    convert_safe_params,
    register,
    sample_kl_ppo_params,
    sample_safe_a2c_params,
    train,
)

ROOT = Path(__file__).resolve().parent.parent
CONFIG_ALGOS = ("kl_ppo", "safe_a2c", "ppo", "a2c")
# The environments the configurations must cover (besides "atari" and "default")
REQUIRED_ENVS = (
    "CartPole-v1",
    "Acrobot-v1",
    "MountainCar-v0",
    "Pendulum-v1",
    "MountainCarContinuous-v0",
    "Hopper-v5",
    "HalfCheetah-v5",
    "Walker2d-v5",
    "Ant-v5",
    "Humanoid-v5",
    "Swimmer-v5",
    "Reacher-v5",
    "InvertedPendulum-v5",
    "InvertedDoublePendulum-v5",
)
# The environment each special entry is trained on: an Atari game per file, and an id no file lists for "default"
ATARI_ENVS = {
    "kl_ppo": "PongNoFrameskip-v4",
    "safe_a2c": "BreakoutNoFrameskip-v4",
    "ppo": "SpaceInvadersNoFrameskip-v4",
    "a2c": "PongNoFrameskip-v4",
}
DEFAULT_ENV = "Pusher-v5"
GUARD = {"sb3_safe.NonFiniteGuardCallback": {"on_nonfinite": "rollback"}}
ZOO_DIR = Path(rl_zoo3.__file__).parent / "hyperparams"


def load_config(algo: str) -> dict[str, dict[str, Any]]:
    return yaml.safe_load(config_path(algo).read_text())


def zoo_citations(algo: str) -> dict[str, tuple[str, str]]:
    """Entry -> (zoo file, zoo entry) from the ``# zoo: <file>.yml "<entry>"`` comment above each entry."""
    citations = re.findall(r'^# zoo: (\w+)\.yml "([^"]+)".*\n(?:#.*\n)*([\w-]+):', config_path(algo).read_text(), re.M)
    return {entry: (zoo_file, zoo_entry) for zoo_file, zoo_entry, entry in citations}


#: The entries that turn the adaptive learning rate on (the others measured no better with it, or were not measured)
ADAPTIVE_LR_ENTRIES = {("kl_ppo", "Pendulum-v1")}
CONFIG_ENTRIES = [(algo, entry) for algo in CONFIG_ALGOS for entry in load_config(algo)]


def test_configs_cover_the_required_environments() -> None:
    for algo in CONFIG_ALGOS:
        assert set(load_config(algo)) == {*REQUIRED_ENVS, "atari", "default"}, algo


def test_top_level_zoo_configs_is_the_packaged_folder() -> None:
    # One copy: the repository's zoo_configs/ is the package's folder
    assert (ROOT / "zoo_configs").resolve() == CONFIG_DIR.resolve()
    packaged = (*CONFIG_ALGOS, "ppo_lstm")
    assert sorted(path.name for path in (ROOT / "zoo_configs").glob("*.yml")) == sorted(f"{a}.yml" for a in packaged)
    assert config_path("kl_ppo") == CONFIG_DIR / "kl_ppo.yml"
    available = "a2c, kl_ppo, ppo, ppo_lstm, safe_a2c"
    with pytest.raises(ZooUsageError, match=rf"no packaged configuration for 'sac'; available: {available}"):
        config_path("sac")


@pytest.mark.parametrize("algo, entry", CONFIG_ENTRIES)
def test_entry_is_rl_zoo_entry_it_cites_plus_guard(algo: str, entry: str) -> None:
    """Every entry cites an rl-zoo entry and keeps its values; it changes only the policy and adds the guard (and,
    for kl_ppo, its KL target). No entry sets normalize_observations: the policy's default decides it."""
    ours = dict(load_config(algo)[entry])
    zoo_file, zoo_entry = zoo_citations(algo)[entry]
    assert zoo_file == {"kl_ppo": "ppo", "safe_a2c": "a2c"}.get(algo, algo)
    zoo = dict(yaml.safe_load((ZOO_DIR / f"{zoo_file}.yml").read_text())[zoo_entry])

    assert ours.pop("callback") == [GUARD]
    policy = zoo.pop("policy")
    expected_policy = policy if algo in ("kl_ppo", "safe_a2c") else f"sb3_safe.Safe{policy}"
    assert ours.pop("policy") == expected_policy
    if algo == "kl_ppo" and entry != "atari":
        # d_targ measured for the penalty on top of clipping (see kl_ppo.yml's header)
        assert ours.pop("adaptive_kl_target") == 0.03
    if (algo, entry) in ADAPTIVE_LR_ENTRIES:
        # where the robustness map measured the adaptive learning rate better (see the entry's comment)
        assert ours.pop("adaptive_lr") == {}
    if (algo, entry) == ("safe_a2c", "atari"):
        # SafeA2C's shortcut for the zoo's optimizer setting
        assert zoo.pop("policy_kwargs") == "dict(optimizer_class=RMSpropTFLike, optimizer_kwargs=dict(eps=1e-5))"
        assert ours.pop("use_rms_prop_tf_like") is True
    assert_policy_default_observations(ours)
    assert ours == zoo
    # rl-zoo's schema: policy_kwargs as a Python string, schedules as lin_<value>
    for value in ours.values():
        assert not isinstance(value, dict)
    if "policy_kwargs" in ours:
        assert isinstance(ours["policy_kwargs"], str)
    for key in ("learning_rate", "clip_range"):
        if isinstance(ours.get(key), str):
            assert re.fullmatch(r"lin_[0-9.e-]+", ours[key])


def test_register_adds_our_algorithms_next_to_the_stock_ones() -> None:
    register()
    assert ALGOS["kl_ppo"] is KLAdaptivePPO and ALGOS["safe_a2c"] is SafeA2C
    assert ALGOS["ppo"] is PPO and ALGOS["a2c"] is A2C
    assert HYPERPARAMS_SAMPLER["kl_ppo"] is sample_kl_ppo_params
    assert HYPERPARAMS_SAMPLER["safe_a2c"] is sample_safe_a2c_params
    assert HYPERPARAMS_CONVERTER["kl_ppo"] is HYPERPARAMS_CONVERTER["safe_a2c"] is convert_safe_params


@pytest.mark.parametrize("algo, entry", CONFIG_ENTRIES)
def test_entry_trains_one_update_through_rl_zoo3(
    algo: str, entry: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # MuJoCo writes its warnings to MUJOCO_LOG.TXT in the working directory
    config = load_config(algo)[entry]
    env_id = {"atari": ATARI_ENVS[algo], "default": DEFAULT_ENV}.get(entry, entry)
    algo_class = {"kl_ppo": KLAdaptivePPO, "safe_a2c": SafeA2C, "ppo": PPO, "a2c": A2C}[algo]
    # Atari with one environment instead of 8 or 16, to keep the CNN update small
    overrides = {"n_envs": 1} if entry == "atari" else {}
    expected_config = {**config, **overrides}
    # One rollout: n_steps per environment (the algorithm's default if the entry has none) times n_envs
    n_steps = expected_config.get("n_steps", inspect.signature(algo_class).parameters["n_steps"].default)
    budget = n_steps * expected_config.get("n_envs", 1)
    args = ["--algo", algo, "--env", env_id, "-n", str(budget), "-f", str(tmp_path), "--seed", "0", "--eval-freq", "-1"]
    args += ["--verbose", "0", *(["--hyperparams", *(f"{k}:{v}" for k, v in overrides.items())] if overrides else [])]
    # Stock algorithms through the repository's zoo_configs/; ours without --conf-file: the packaged file
    conf_file = str(ROOT / "zoo_configs" / f"{algo}.yml") if algo in ("ppo", "a2c") else str(config_path(algo))
    if algo in ("ppo", "a2c"):
        args += ["--conf-file", conf_file]
    assert train(args, report=False) is None

    run = tmp_path / algo / f"{env_id}_1"
    model = algo_class.load(run / f"{env_id}.zip", device="cpu")
    assert model.num_timesteps == budget
    assert model._n_updates >= 1
    assert isinstance(model.policy, SafeCnnPolicy if entry == "atari" else SafeActorCriticPolicy)
    # Under a stock algorithm and SafeA2C the safe policy computes SB3's observations (its default): only VecNormalize
    # normalizes them, where the entry has it. KLAdaptivePPO ("auto"): observations normalized once, by VecNormalize
    # where the entry has it normalize them, else by the policy (Box observations that are not images)
    policy_normalizes = algo == "kl_ppo" and entry != "atari" and not vec_normalize_normalizes_observations(config)
    assert model.policy.normalize_observations is policy_normalizes
    assert hasattr(model.policy, "observation_normalizer") is policy_normalizes
    saved_args = yaml.load((run / env_id / "args.yml").read_text(), Loader=yaml.UnsafeLoader)
    assert saved_args["conf_file"] == conf_file
    # rl_zoo3 saves the hyperparameters it read: exactly the entry (and the override)
    assert yaml.load((run / env_id / "config.yml").read_text(), Loader=yaml.UnsafeLoader) == expected_config


# ----- input checks -----


def test_hyperparam_type_check_accepts_every_rl_zoo3_entry(tmp_path: Path) -> None:
    """Every `sb3-safe train` checks the types: rl_zoo3's own configurations (the stock algorithms' default) pass."""
    register()
    n_entries = n_checked = 0
    for path in sorted(ZOO_DIR.glob("*.yml")):
        if path.stem not in ALGOS:
            continue  # her.yml: HER is a replay buffer, not an algorithm
        for hyperparams in yaml.safe_load(path.read_text()).values():
            n_entries += 1
            manager = ExperimentManager(argparse.Namespace(), path.stem, "CartPole-v1", str(tmp_path), verbose=0)
            try:
                # As rl_zoo3 hands them to the constructor: schedules, policy_kwargs, callbacks converted
                processed = manager._preprocess_hyperparams(dict(hyperparams))[0]
            except ImportError:  # wrappers from packages not installed here (minigrid, ...)
                continue
            check_hyperparam_types(path.stem, processed)
            n_checked += 1
    # rl_zoo3 2.9: 261 of 276
    assert n_checked >= 0.9 * n_entries


def test_config_entry_check_falls_back_as_rl_zoo3_does(tmp_path: Path) -> None:
    conf = tmp_path / "mine.yml"
    # Keys of environments not installed here are no typos unless close to the requested id
    conf.write_text("HalfCheetahBulletEnv-v0:\n  n_timesteps: 64\ndefault:\n  n_timesteps: 64\n")
    check_config_file(str(conf), "HalfCheetah-v5")
    conf.write_text("atari:\n  n_timesteps: 64\n")
    check_config_file(str(conf), "PongNoFrameskip-v4")
    with pytest.raises(ZooUsageError, match=r"has no entry 'CartPole-v1' and no 'default' entry; its entries: atari$"):
        check_config_file(str(conf), "CartPole-v1")
    conf.write_text("Hoper-v5:\n  n_timesteps: 64\natari:\n  n_timesteps: 64\n")
    with pytest.raises(
        ZooUsageError, match=r"but 'Hoper-v5', .* a typo of 'Hopper-v5'\? \(rl_zoo3 would train with no entry\)"
    ):
        check_config_file(str(conf), "Hopper-v5")
    conf.write_text("CartPole-v1: 64\n")
    with pytest.raises(ZooUsageError, match=r"the entry 'CartPole-v1' must map hyperparameter names to values, got 64"):
        check_config_file(str(conf), "CartPole-v1")


# ----- optuna samplers -----


def _sample(sampler: Any, n_actions: int, seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    trial = study.ask()
    return sampler(trial, n_actions, 1, {}), trial.params


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("algo, sampler", [("kl_ppo", sample_kl_ppo_params), ("safe_a2c", sample_safe_a2c_params)])
@pytest.mark.parametrize("env_id, n_actions", [("CartPole-v1", 0), ("Pendulum-v1", 1)])
def test_sampler_extends_rl_zoo3_and_builds_the_algorithm(
    algo: str, sampler: Any, env_id: str, n_actions: int, seed: int
) -> None:
    hyperparams, raw = _sample(sampler, n_actions, seed)
    stock = {"kl_ppo": "ppo", "safe_a2c": "a2c"}[algo]
    # rl_zoo3's own parameters, plus ours
    stock_params, _ = _sample(HYPERPARAMS_SAMPLER[stock], n_actions, seed)
    for key in stock_params:
        assert key in hyperparams
    policy_kwargs = hyperparams["policy_kwargs"]
    if n_actions > 0:
        low, high = policy_kwargs["log_std_range"]
        assert -20.0 <= low <= -2.0 and 0.0 <= high <= 2.0
        assert "logit_bound" not in policy_kwargs and "logit_bound" not in raw
    else:
        assert 2.0 <= policy_kwargs["logit_bound"] <= 20.0
        assert "log_std_range" not in policy_kwargs and "log_std_min" not in raw
    if algo == "kl_ppo":
        assert 0.003 <= hyperparams["adaptive_kl_target"] <= 0.03
        assert 0.1 <= hyperparams["initial_kl_beta"] <= 10.0
    low, high = {"kl_ppo": (0.003, 0.3), "safe_a2c": (3e-4, 3e-2)}[algo]
    assert low <= hyperparams["adaptive_lr"]["target_kl"] <= high
    assert policy_kwargs["activation_fn"] in (nn.Tanh, nn.ReLU)
    # What rl_zoo3's --trial-id rebuilds from the stored trial is what the sampler returned
    assert convert_safe_params(raw) == hyperparams
    # The sampled keywords are accepted by the algorithm and its safe policy
    model = {"kl_ppo": KLAdaptivePPO, "safe_a2c": SafeA2C}[algo]("MlpPolicy", env_id, **hyperparams)
    if n_actions > 0:
        assert model.policy.log_std_range == policy_kwargs["log_std_range"]
    else:
        assert model.policy.logit_bound == policy_kwargs["logit_bound"]
    assert model.adaptive_lr == hyperparams["adaptive_lr"]
    assert model.normalize_value is hyperparams["normalize_value"] is raw["normalize_value"]


# ----- package data -----


def test_non_editable_install_ships_the_configs(tmp_path: Path) -> None:
    """A wheel install (not editable) finds its configurations from any working directory and trains with them."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source)
    shutil.copytree(ROOT / "sb3_safe", source / "sb3_safe", ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    # Offline with the environment's setuptools when it has one (Python < 3.12 venvs do)
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    subprocess.run([*pip, "wheel", "--no-deps", *isolation, "-w", str(tmp_path / "dist"), str(source)], check=True)
    (wheel,) = (tmp_path / "dist").glob("sb3_safe-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = sorted(name for name in archive.namelist() if name.endswith(".yml"))
    assert shipped == [f"sb3_safe/zoo_configs/{algo}.yml" for algo in sorted((*CONFIG_ALGOS, "ppo_lstm"))]

    target = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--target", str(target), str(wheel)], check=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(target), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "sb3_safe", "train", "--algo", "safe_a2c", "--env", "CartPole-v1", "-n", "40"]
    result = subprocess.run([*command, "--no-report", "-f", "runs"], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert f"Loading hyperparameters from: {target / 'sb3_safe' / 'zoo_configs' / 'safe_a2c.yml'}" in result.stdout
    assert (elsewhere / "runs" / "safe_a2c" / "CartPole-v1_1" / "CartPole-v1.zip").is_file()
