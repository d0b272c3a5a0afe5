"""`sb3-safe train` / `enjoy` on bad input: exit status 2 and one line on stderr, before any training."""

from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm

from sb3_safe import KLAdaptivePPO
from sb3_safe.cli import EXIT_USAGE, main

TRAIN = ["train", "--algo", "kl_ppo", "--env", "CartPole-v1", "-n", "64"]
ENJOY = ["enjoy", "--algo", "kl_ppo", "--env", "CartPole-v1", "--no-render", "-n", "10"]


def _config(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "mine.yml"
    path.write_text(text)
    return ["--conf-file", str(path)]


def _study_with_two_trials(tmp_path: Path) -> list[str]:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(storage=storage, study_name="kl")
    for value in (1.0, 2.0):
        distributions = {"adaptive_kl_target": optuna.distributions.FloatDistribution(0.003, 0.03)}
        study.add_trial(
            optuna.trial.create_trial(params={"adaptive_kl_target": 0.01}, distributions=distributions, value=value)
        )
    return ["--storage", storage, "--study-name", "kl"]


# (the command line, given the test's folder; a fragment of its error line)
CASES: dict[str, tuple[Callable[[Path], list[str]], str]] = {
    "bad-kl-target": (
        lambda _: [*TRAIN, "--hyperparams", "adaptive_kl_target:-1"],
        "bad configuration for kl_ppo: adaptive_kl_target must be positive and finite, got -1",
    ),
    "bad-kl-beta-bounds": (lambda _: [*TRAIN, "--hyperparams", "kl_beta_bounds:(0,1)"], "kl_beta_bounds="),
    "bad-logit-bound": (lambda _: [*TRAIN, "--hyperparams", "policy_kwargs:dict(logit_bound=0)"], "logit_bound must be"),
    "equals-for-colon": (
        lambda _: [*TRAIN, "--hyperparams", "n_epochs=5"],
        "--hyperparams takes key:value items, got 'n_epochs=5'; did you mean n_epochs:5?",
    ),
    "value-not-python": (lambda _: [*TRAIN, "--hyperparams", "n_epochs:abc"], "--hyperparams n_epochs:abc: cannot evaluate"),
    "yaml-syntax-error": (
        lambda tmp: [*TRAIN, *_config(tmp, "CartPole-v1:\n  n_timesteps: 64\n  n_epochs: [3\n")],
        "invalid YAML at line 4",
    ),
    "callback-choice-typo": (
        lambda tmp: [
            *TRAIN,
            *_config(
                tmp,
                "CartPole-v1:\n  n_timesteps: 64\n  policy: MlpPolicy\n  callback:\n"
                "    - sb3_safe.NonFiniteGuardCallback:\n        on_nonfinite: rolback\n",
            ),
        ],
        "on_nonfinite must be one of ('raise', 'stop', 'rollback'), got 'rolback'; did you mean: rollback?",
    ),
    "missing-conf-file": (lambda tmp: [*TRAIN, "--conf-file", str(tmp / "mine.yaml")], "mine.yaml: no such file"),
    "enjoy-with-i": (lambda _: [*ENJOY, "-i", "missing.zip"], "unrecognized arguments: -i missing.zip"),
    "enjoy-missing-folder": (lambda tmp: [*ENJOY, "-f", str(tmp / "nowhere")], "kl_ppo folder was not found"),
    "train-missing-model": (lambda tmp: [*TRAIN, "-i", str(tmp / "missing.zip")], "missing.zip: no such file"),
    "train-model-is-folder": (lambda tmp: [*TRAIN, "-i", str(tmp)], "is a directory; pass the model's .zip"),
    "trial-id-out-of-range": (
        lambda tmp: [*TRAIN, *_study_with_two_trials(tmp), "--trial-id", "7"],
        "--trial-id 7: study 'kl' has 2 trials, numbered 0 to 1",
    ),
    "env-key-typo": (
        lambda tmp: [*TRAIN, *_config(tmp, "CartPol-v1:\n  n_timesteps: 64\ndefault:\n  n_timesteps: 64\n")],
        "has no entry 'CartPole-v1' but 'CartPol-v1', which is no registered environment id",
    ),
    "value-of-wrong-type": (
        lambda tmp: [*TRAIN, *_config(tmp, "CartPole-v1:\n  n_timesteps: 64\n  policy: MlpPolicy\n  n_epochs: twenty\n")],
        "config value n_epochs: 'twenty' is a str, but kl_ppo (KLAdaptivePPO) takes n_epochs: int",
    ),
}


def _no_training(*args, **kwargs) -> None:
    raise AssertionError("training started")


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_exits_2_with_one_line_before_training(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_args, fragment = CASES[case]
    args = make_args(tmp_path)
    if args[0] == "train":
        args += ["-f", str(tmp_path / "logs")]
    monkeypatch.setattr(OnPolicyAlgorithm, "collect_rollouts", _no_training)
    capsys.readouterr()
    assert main(args) == EXIT_USAGE
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"sb3-safe {args[0]}: error: ")
    assert fragment in lines[0]
    # No run folder is left behind: `enjoy` would take it for the latest run
    assert not list(tmp_path.glob("logs/*/*_[0-9]*"))


def test_training_errors_are_not_usage_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A ValueError of the first update, after the first rollout, is a crash to see in full, not bad input
    def crash(*args, **kwargs) -> None:
        raise ValueError("crash inside training")

    monkeypatch.setattr(KLAdaptivePPO, "train", crash)
    with pytest.raises(ValueError, match="crash inside training") as error:
        main([*TRAIN, "-f", str(tmp_path), "--eval-freq", "-1"])
    assert type(error.value) is ValueError  # not ZooUsageError, a ValueError too
