"""`sb3-safe enjoy` without `-f`: train saves in logs/, enjoy looks in rl-trained-agents/ (rl_zoo3's defaults)."""

from pathlib import Path

import pytest

from sb3_safe.cli import EXIT_USAGE, main


@pytest.mark.parametrize("algo", ["kl_ppo", "ppo"])
def test_enjoy_without_folder_says_where_it_looked_and_where_train_saves(
    algo: str, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A new user's first try, in a folder of their own: no rl-trained-agents/ there, and no trust in hub pickles
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TRUST_REMOTE_CODE", raising=False)
    capsys.readouterr()
    assert main(["enjoy", "--algo", algo, "--env", "Pendulum-v1", "--no-render", "-n", "10"]) == EXIT_USAGE
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        f"sb3-safe enjoy: error: The rl-trained-agents/{algo} folder was not found; no runs in rl-trained-agents; enjoy"
        " looks there without -f, and train saves in logs: pass -f logs"
    )
    # sb3's hub holds stock models only: the way to them is named for a stock algorithm, not for sb3-safe's
    assert ("TRUST_REMOTE_CODE=True" in lines[0]) == (algo == "ppo")
    assert not (tmp_path / "rl-trained-agents").exists()


def test_enjoy_without_folder_names_the_runs_it_found_there(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Runs of other environments in rl-trained-agents/: named, with where train saves
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TRUST_REMOTE_CODE", raising=False)
    (tmp_path / "rl-trained-agents" / "a2c" / "Acrobot-v1_1").mkdir(parents=True)
    capsys.readouterr()
    assert main(["enjoy", "--algo", "kl_ppo", "--env", "Pendulum-v1", "--no-render"]) == EXIT_USAGE
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert "runs there: a2c/Acrobot-v1; enjoy looks there without -f, and train saves in logs: pass -f logs" in lines[0]
