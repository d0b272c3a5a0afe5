"""`sb3-safe train` / `enjoy` end to end through rl_zoo3: CartPole run, report, enjoy, -optimize, bad input."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import optuna
import pytest
import yaml

from sb3_safe import KLAdaptivePPO, SafeA2C
from sb3_safe.cli import EXIT_USAGE, main
from sb3_safe.zoo import LEARNING_CURVE

ROOT = Path(__file__).resolve().parent.parent
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_train_report_then_enjoy_and_load(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # python -m sb3_safe, as a user runs it: 2,048 steps of 8 CartPoles, rl_zoo3's evaluation every 1,024 steps
    command = [sys.executable, "-m", "sb3_safe", "train", "--algo", "kl_ppo", "--env", "CartPole-v1", "-n", "2048"]
    command += ["-f", str(tmp_path), "--seed", "3", "--eval-freq", "1024", "--eval-episodes", "3", "-P", "--num-threads", "1"]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    run = tmp_path / "kl_ppo" / "CartPole-v1_1"
    model_path = run / "CartPole-v1.zip"
    lines = result.stdout.splitlines()
    assert lines[-3] == f"saved model: {model_path}"
    assert lines[-2] == f"learning curve: {run / LEARNING_CURVE}"
    assert lines[-1].startswith("evaluation over 3 episodes (deterministic): mean return ")
    assert (run / LEARNING_CURVE).read_bytes().startswith(PNG_MAGIC)
    # rl_zoo3's own periodic evaluation ran too
    assert np.load(run / "evaluations.npz")["timesteps"].tolist() == [1024, 2048]

    model = KLAdaptivePPO.load(model_path, device="cpu")
    assert model.num_timesteps == 2048 and model.n_steps == 32 and model.n_envs == 8  # rl-zoo's CartPole entry
    # The report's mean is that of deterministic episodes of this model: its returns are whole episode lengths
    mean = float(lines[-1].split("mean return ")[1].split(" +/- ")[0])
    assert 8.0 <= mean <= 500.0

    capsys.readouterr()
    steps = "600"
    assert main(["enjoy", "--algo", "kl_ppo", "--env", "CartPole-v1", "-f", str(tmp_path), "--no-render", "-n", steps]) == 0
    out = capsys.readouterr().out
    assert f"Loading {model_path}" in out
    assert "Episode Reward:" in out and "Mean reward:" in out


def test_help_lists_ours_and_rl_zoo3_options(capsys: pytest.CaptureFixture) -> None:
    assert main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--no-report" in out and "kl_ppo    KLAdaptivePPO" in out
    assert "--optimize-hyperparameters" in out and "--conf-file" in out  # rl_zoo3's


def test_doctor_still_rejects_unknown_arguments(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["doctor", "model.zip", "--bogus"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["train", "--algo", "kl_ppoo", "--env", "CartPole-v1"],
            "sb3-safe train: error: unknown algorithm 'kl_ppoo'; did you mean: kl_ppo, ppo?",
        ),
        (
            ["enjoy", "--algo", "safe_a2", "--env", "CartPole-v1"],
            "sb3-safe enjoy: error: unknown algorithm 'safe_a2'; did you mean: safe_a2c?",
        ),
        (
            ["train", "--algo", "kl_ppo", "--env", "Hoper-v5"],
            "sb3-safe train: error: unknown environment id 'Hoper-v5'; did you mean: Hopper-v5, Hopper-v4, Hopper-v3?",
        ),
        (
            ["train", "--algo", "kl_ppo", "--env", "qqqqqqq"],
            "sb3-safe train: error: unknown environment id 'qqqqqqq'; no close match in gymnasium's registry",
        ),
    ],
)
def test_unknown_algorithm_or_environment_is_one_line(args: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    assert main(args) == EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.err == message + "\n"
    assert captured.out == ""


@pytest.mark.parametrize(
    "algo, extra, message",
    [
        (
            "kl_ppo",
            ["--hyperparams", "kl_target:0.02"],
            "algorithm kl_ppo (KLAdaptivePPO) does not accept the config key 'kl_target'; "
            "did you mean: target_kl, adaptive_kl_target?",
        ),
        (
            "ppo",
            ["--conf-file", str(ROOT / "zoo_configs" / "ppo.yml"), "--hyperparams", "adaptive_kl_target:0.02"],
            "algorithm ppo (PPO) does not accept the config key 'adaptive_kl_target'; it takes: policy, learning_rate, "
            "n_steps, batch_size, n_epochs, gamma, gae_lambda, clip_range, clip_range_vf, normalize_advantage, ent_coef, "
            "vf_coef, max_grad_norm, use_sde, sde_sample_freq, rollout_buffer_class, rollout_buffer_kwargs, target_kl, "
            "stats_window_size, tensorboard_log, policy_kwargs, verbose, seed, device",
        ),
        (
            "safe_a2c",
            ["--hyperparams", "policy_kwargs:dict(log_std_rnge=(-5,1))"],
            "ActorCriticPolicy does not accept the keyword 'log_std_rnge' "
            "(from policy_kwargs, env_kwargs or a callback or wrapper)",
        ),
    ],
)
def test_config_key_the_algorithm_rejects_is_one_line(
    algo: str, extra: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    args = ["train", "--algo", algo, "--env", "CartPole-v1", "-n", "64", "-f", str(tmp_path), *extra]
    assert main(args) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.endswith(f"sb3-safe train: error: {message}\n")
    assert "Traceback" not in err


def test_config_file_key_typo_names_the_key(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    conf = tmp_path / "mine.yml"
    conf.write_text("CartPole-v1:\n  n_timesteps: 64\n  policy: MlpPolicy\n  n_epoch: 3\n")
    args = ["train", "--algo", "kl_ppo", "--env", "CartPole-v1", "--conf-file", str(conf), "-f", str(tmp_path)]
    assert main(args) == EXIT_USAGE
    err = capsys.readouterr().err
    expected = "algorithm kl_ppo (KLAdaptivePPO) does not accept the config key 'n_epoch'; did you mean: n_epochs"
    assert err.endswith(f"sb3-safe train: error: {expected}?\n")
    assert "Traceback" not in err


def test_optimize_two_workers_share_a_study_then_train_a_trial(tmp_path: Path) -> None:
    """Two -optimize runs (as on two machines) add one trial each to one study; --trial-id trains a trial's values."""
    storage, study_name = f"sqlite:///{tmp_path / 'study.db'}", "kl_cartpole"
    study = optuna.create_study(storage=storage, study_name=study_name, direction="maximize")
    for _ in range(2):
        # Small rollouts and one epoch keep each trial to a second; the rest is sampled
        study.enqueue_trial({"n_steps_pow": 5, "batch_size_pow": 6, "n_epochs": 1, "net_arch": "tiny"})
    for seed in ("1", "2"):
        args = ["train", "--algo", "kl_ppo", "--env", "CartPole-v1", "-optimize", "--n-trials", "1", "-n", "512"]
        args += ["--storage", storage, "--study-name", study_name, "--n-evaluations", "1", "--eval-episodes", "2"]
        # One log folder per worker (one per machine): rl_zoo3 names a report by the second it was written
        folder = tmp_path / f"worker_{seed}"
        args += ["--sampler", "random", "--pruner", "none", "--no-optim-plots", "-f", str(folder), "--seed", seed]
        assert main(args) == 0

    trials = optuna.load_study(storage=storage, study_name=study_name).trials
    assert [trial.state for trial in trials] == [optuna.trial.TrialState.COMPLETE] * 2
    for trial in trials:
        assert 0.003 <= trial.params["adaptive_kl_target"] <= 0.03
        assert 0.1 <= trial.params["initial_kl_beta"] <= 10.0
        assert 2.0 <= trial.params["logit_bound"] <= 20.0  # CartPole: discrete actions
        assert "log_std_min" not in trial.params
        assert trial.value is not None and trial.value > 0
    for seed in ("1", "2"):
        reports = (tmp_path / f"worker_{seed}" / "kl_ppo").glob("report_CartPole-v1_1-trials-512-random-none_*.csv")
        assert len(list(reports)) == 1

    # rl_zoo3 rebuilds trial 1's hyperparameters with our converter
    args = ["train", "--algo", "kl_ppo", "--env", "CartPole-v1", "-n", "256", "--storage", storage]
    args += ["--study-name", study_name, "--trial-id", "1", "-f", str(tmp_path / "trained"), "--no-report"]
    assert main(args) == 0
    params = trials[1].params
    model = KLAdaptivePPO.load(tmp_path / "trained" / "kl_ppo" / "CartPole-v1_1" / "CartPole-v1.zip", device="cpu")
    assert model.adaptive_kl_target == pytest.approx(params["adaptive_kl_target"])
    assert model.kl_beta_bounds[0] <= model.kl_beta <= model.kl_beta_bounds[1]
    assert model.policy.logit_bound == pytest.approx(params["logit_bound"])
    assert model.n_steps == 2 ** params["n_steps_pow"] and model.batch_size == 2 ** params["batch_size_pow"]
    assert model.gamma == pytest.approx(1 - params["one_minus_gamma"])


def test_safe_a2c_on_pendulum_with_normalization_is_evaluated_with_its_statistics(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # The zoo's Pendulum entry normalizes observations: the report must evaluate with the saved statistics
    args = ["train", "--algo", "safe_a2c", "--env", "Pendulum-v1", "-n", "640", "-f", str(tmp_path), "--seed", "0"]
    assert main([*args, "--eval-freq", "-1", "--eval-episodes", "2"]) == 0
    run = tmp_path / "safe_a2c" / "Pendulum-v1_1"
    assert (run / "Pendulum-v1" / "vecnormalize.pkl").is_file()
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("evaluation over 2 episodes (deterministic): mean return -")
    # 640 steps of 8 Pendulums: no 200-step episode has finished, so there is no curve to plot
    assert lines[-2] == "learning curve: none (no training episode finished)"
    assert not (run / LEARNING_CURVE).exists()
    saved = yaml.load((run / "Pendulum-v1" / "config.yml").read_text(), Loader=yaml.UnsafeLoader)
    assert saved["normalize"] is True
    assert isinstance(SafeA2C.load(run / "Pendulum-v1.zip", device="cpu"), SafeA2C)
