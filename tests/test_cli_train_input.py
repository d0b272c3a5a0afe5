"""
`sb3-safe train` on the paths a user hits, through the installed entry point: bad input (a negative -n, a
hyperparameter out of range, a policy_kwargs that does not parse) is one line on stderr and exit status 2, with
nothing on stdout before it; Ctrl-C during training saves the model, says so and exits 130; -h prints the help only;
output into a closed pipe ends quietly.
"""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import sb3_safe
from sb3_safe.cli import EXIT_INTERRUPTED, EXIT_USAGE, main
from sb3_safe.zoo.config_errors import RANGES

SB3_SAFE = str(Path(sys.executable).parent / "sb3-safe")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
TIMEOUT = 300


def sb3_safe_run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SB3_SAFE, *args], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=TIMEOUT, check=False)


def assert_refused(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """Exit status 2, one line on stderr naming the problem; on stdout at most the configuration line, no dump."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == EXIT_USAGE, (result.returncode, result.stderr[-3000:])
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert lines[0].startswith("sb3-safe train: error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert_no_dump(result.stdout)
    return lines[0]


def assert_no_dump(out: str) -> None:
    """At most the run's first line, which names the configuration file (rl_zoo3's dump of the values is held back)."""
    lines = out.splitlines()
    assert len(lines) <= 1, out[-3000:]
    assert all(line.startswith("sb3-safe train: configuration ") for line in lines), out[-3000:]


@pytest.mark.parametrize("n", ["-5", "0"])
def test_train_refuses_a_number_of_timesteps_not_above_zero(n: str, tmp_path: Path) -> None:
    result = sb3_safe_run("train", "--algo", "kl_ppo", "--env", "CartPole-v1", "-n", n, cwd=tmp_path)
    assert_refused(result, f"-n {n}: the number of timesteps to train must be > 0")
    assert not (tmp_path / "logs").exists()


def test_enjoy_refuses_a_number_of_timesteps_not_above_zero(tmp_path: Path) -> None:
    result = sb3_safe_run("enjoy", "--algo", "kl_ppo", "--env", "CartPole-v1", "-n", "-5", cwd=tmp_path)
    assert result.returncode == EXIT_USAGE and "Traceback" not in result.stderr
    assert result.stderr.strip() == "sb3-safe enjoy: error: -n -5: the number of timesteps to run the agent must be > 0"


def test_gamma_out_of_range_in_a_conf_file(tmp_path: Path) -> None:
    (tmp_path / "conf.yml").write_text("CartPole-v1:\n  n_timesteps: 1000\n  policy: MlpPolicy\n  gamma: 1.5\n")
    result = sb3_safe_run("train", "--algo", "ppo", "--env", "CartPole-v1", "-conf", "conf.yml", cwd=tmp_path)
    assert_refused(result, "config value gamma: 1.5 is out of range; gamma takes values in (0, 1]")
    assert not (tmp_path / "logs").exists()


def test_malformed_policy_kwargs_in_a_conf_file(tmp_path: Path) -> None:
    conf = 'CartPole-v1:\n  n_timesteps: 1000\n  policy: MlpPolicy\n  policy_kwargs: "dict(net_arch=[64, 64]"\n'
    (tmp_path / "conf.yml").write_text(conf)
    result = sb3_safe_run("train", "--algo", "ppo", "--env", "CartPole-v1", "-conf", "conf.yml", cwd=tmp_path)
    assert_refused(result, "config value policy_kwargs: 'dict(net_arch=[64, 64]' is not a Python expression")


# Every range, in-process (the same code path): the value, the key and the range it takes in one line
OUT_OF_RANGE = [
    ("gamma", "0", "values in (0, 1]"),
    ("gamma", "1.0001", "values in (0, 1]"),
    ("gae_lambda", "-0.1", "values in [0, 1]"),
    ("gae_lambda", "1.5", "values in [0, 1]"),
    ("learning_rate", "0", "values > 0"),
    ("learning_rate", "-0.001", "values > 0"),
    ("n_steps", "0", "values > 0"),
    ("batch_size", "-64", "values > 0"),
    ("n_epochs", "0", "values > 0"),
    ("ent_coef", "-0.01", "values >= 0"),
    ("vf_coef", "-1", "values >= 0"),
    ("max_grad_norm", "0", "values > 0"),
    ("clip_range", "0", "values > 0"),
    ("clip_range", "float('nan')", "values > 0"),
    ("n_envs", "0", "values > 0"),
]


@pytest.mark.parametrize(("key", "value", "allowed"), OUT_OF_RANGE)
def test_hyperparameter_out_of_range_is_refused_by_name(
    key: str, value: str, allowed: str, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    status = main(["train", "--algo", "kl_ppo", "--env", "CartPole-v1", "-n", "64", "-params", f"{key}:{value}"])
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == EXIT_USAGE, err[-3000:]
    assert len(lines) == 1, err[-2000:]
    assert_no_dump(out)
    assert lines[0].startswith(f"sb3-safe train: error: config value {key}: "), lines[0]
    assert f"is out of range; {key} takes {allowed}" in lines[0], lines[0]
    assert not (tmp_path / "logs").exists()


def test_every_range_is_tested() -> None:
    tested = {key for key, _, _ in OUT_OF_RANGE}
    # Off-policy keys: the same check, not worth a training setup each
    assert set(RANGES) - tested <= {"tau", "clip_range_vf", "target_kl", "buffer_size", "learning_starts", "n_timesteps"}


def test_values_at_the_edges_of_the_ranges_train(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    params = ["gamma:1.0", "gae_lambda:0.0", "ent_coef:0.0", "vf_coef:0.0"]
    common = ["--num-threads", "1", "-f", str(tmp_path), "--no-report", "--seed", "1"]
    assert main(["train", "--algo", "ppo", "--env", "CartPole-v1", "-n", "256", "-params", *params, *common]) == 0
    assert "sb3-safe train: configuration" in capsys.readouterr().out


def test_sigint_during_training_saves_the_model_and_exits_130(tmp_path: Path) -> None:
    command = [SB3_SAFE, "train", "--algo", "kl_ppo", "--env", "CartPole-v1", "-n", "1000000"]
    command += ["--num-threads", "1", "-f", "logs", "--seed", "1"]
    process = subprocess.Popen(command, cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None
    try:
        # SB3's first progress table: training has started
        for line in process.stdout:
            if "total_timesteps" in line:
                break
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=TIMEOUT)
    finally:
        process.kill()
    model = tmp_path / "logs" / "kl_ppo" / "CartPole-v1_1" / "CartPole-v1.zip"
    assert process.returncode == EXIT_INTERRUPTED, err[-3000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err, err[-3000:]
    assert lines[-1].startswith("sb3-safe train: interrupted at step "), lines
    step, _, rest = lines[-1].removeprefix("sb3-safe train: interrupted at step ").partition(" of ")
    assert rest == f"1000000, model saved to {model.relative_to(tmp_path)}", lines[-1]
    # Not presented as a finished run: no evaluation, no learning curve
    assert "evaluation over" not in out and not (model.parent / "learning_curve.png").exists()
    loaded = sb3_safe.load(sb3_safe.KLAdaptivePPO, model)
    assert loaded.num_timesteps == int(step) > 0


def test_help_prints_only_the_help(tmp_path: Path) -> None:
    result = sb3_safe_run("train", "-h", cwd=tmp_path)
    assert result.returncode == 0 and result.stderr == "", result.stderr[-3000:]
    assert result.stdout.startswith("usage: sb3-safe train")
    # sb3-safe's options, then rl_zoo3's, with sb3-safe's algorithms among the choices; nothing of a run
    assert "--no-report" in result.stdout and "--conf-file" in result.stdout and "kl_ppo" in result.stdout
    assert "sb3-safe train: configuration" not in result.stdout
    assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize("command", ["train --help", "enjoy --help", "doctor --help", "--help"])
def test_help_into_a_closed_pipe_ends_quietly(command: str, tmp_path: Path) -> None:
    result = subprocess.run(
        f"{SB3_SAFE} {command} | head -n 1",
        shell=True,
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert result.stdout.startswith("usage: sb3-safe"), result.stdout
    assert len(result.stdout.splitlines()) == 1
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr, result.stderr
