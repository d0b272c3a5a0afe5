"""`sb3-safe doctor` on real saved models: healthy, corrupted, beyond the limits, and files that are not models."""

import json
import math
import subprocess
import sys
import zipfile
from pathlib import Path

import gymnasium as gym
import pytest
import torch as th
from sb3_contrib import MaskablePPO, RecurrentPPO
from sb3_contrib.common.envs import InvalidActionEnvDiscrete
from stable_baselines3 import PPO, SAC

from sb3_safe import KLAdaptivePPO, SafeMaskableMlpPolicy, SafeMlpLstmPolicy
from sb3_safe.cli import main
from sb3_safe.doctor import EXIT_HEALTHY, EXIT_UNHEALTHY, EXIT_UNREADABLE, STOCK_LOG_STD_RANGE, WEIGHT_LIMIT, diagnose


@pytest.fixture(scope="module")
def healthy_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = PPO("MlpPolicy", "Pendulum-v1", n_steps=32, batch_size=32, n_epochs=1, policy_kwargs=dict(net_arch=[16]), seed=0)
    model.learn(32)
    with th.no_grad():
        model.policy.log_std.copy_(th.tensor([-1.5]))
    path = tmp_path_factory.mktemp("models") / "healthy.zip"
    model.save(path)
    return path


@pytest.fixture(scope="module")
def corrupted_zip(healthy_zip: Path) -> Path:
    model = PPO.load(healthy_zip, device="cpu")
    with th.no_grad():
        model.policy.mlp_extractor.policy_net[0].weight[1, 2] = math.nan
    path = healthy_zip.with_name("corrupted.zip")
    model.save(path)
    return path


def test_healthy_model(healthy_zip: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["doctor", str(healthy_zip)]) == EXIT_HEALTHY
    out = capsys.readouterr().out
    assert "Healthy: all" in out and "are finite" in out
    assert "stable_baselines3.common.policies.ActorCriticPolicy, 32 timesteps" in out
    assert "log-std range: [-1.5, -1.5]" in out
    largest = diagnose(healthy_zip).largest
    model = PPO.load(healthy_zip, device="cpu")
    expected = max(p.abs().max().item() for p in model.policy.parameters())
    assert largest[0][1] == pytest.approx(expected)
    assert f"{largest[0][0]}: {expected:.4g}" in out


def test_nan_weight_is_named(corrupted_zip: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["doctor", str(corrupted_zip)]) == EXIT_UNHEALTHY
    out = capsys.readouterr().out
    assert "UNHEALTHY: 1 of" in out
    assert "policy.mlp_extractor.policy_net.0.weight: 1 NaN, 0 inf of 48" in out
    # The corrupted tensor leads the largest-weights list
    assert diagnose(corrupted_zip).largest[0][0] == "policy.mlp_extractor.policy_net.0.weight"


def test_freshly_saved_stock_model_is_healthy(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    PPO("MlpPolicy", "Pendulum-v1", seed=0).save(tmp_path / "fresh.zip")
    assert main(["doctor", str(tmp_path / "fresh.zip")]) == EXIT_HEALTHY
    out = capsys.readouterr().out
    assert "Healthy: all" in out
    assert "Limits: log-std in [-20, 5] (the range for stock policies), |weight| <= 1e+04" in out


def test_huge_log_std_of_stock_policy_is_unhealthy(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    model = PPO("MlpPolicy", "Pendulum-v1", seed=0)
    with th.no_grad():
        model.policy.log_std.fill_(30.0)  # std 1e13: finite, so not NaN / inf
    model.save(tmp_path / "wide.zip")
    assert main(["doctor", str(tmp_path / "wide.zip")]) == EXIT_UNHEALTHY
    out = capsys.readouterr().out
    assert "UNHEALTHY: 1 policy tensor beyond the limits:" in out
    ceiling = STOCK_LOG_STD_RANGE[1]
    assert (
        f"  policy.log_std: log-std 30 (std 1.069e+13) above {ceiling:g} (std {math.exp(ceiling):.4g}), the ceiling of " in out
    )


def test_log_std_outside_the_range_of_a_safe_policy_is_unhealthy(tmp_path: Path) -> None:
    model = KLAdaptivePPO("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(log_std_range=(-5.3, 1.0), net_arch=[8]))
    with th.no_grad():
        model.policy.log_std.fill_(-100.0)
    # The policy's own clamp to its range, in float32: healthy, at the floor exactly
    model.policy.project_log_std()
    model.save(tmp_path / "floor.zip")
    report = diagnose(tmp_path / "floor.zip")
    assert report.healthy and report.log_std_limits == (-5.3, 1.0)
    with th.no_grad():
        model.policy.log_std.fill_(1.5)
    model.save(tmp_path / "above.zip")
    (beyond,) = diagnose(tmp_path / "above.zip").beyond_limits
    assert (
        str(beyond) == "policy.log_std: log-std 1.5 (std 4.482) above 1 (std 2.718), the ceiling of the policy's log_std_range"
    )
    # Without log_std_range in policy_kwargs: the safe policies' default, (-20, 2)
    model = KLAdaptivePPO("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(net_arch=[8]))
    with th.no_grad():
        model.policy.log_std.fill_(3.0)
    model.save(tmp_path / "default.zip")
    (beyond,) = diagnose(tmp_path / "default.zip").beyond_limits
    assert beyond.limit == 2.0 and beyond.reason == "the ceiling of the default log_std_range of sb3-safe's policies"


def test_huge_weight_is_unhealthy(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    model = PPO("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(net_arch=[8]), seed=0)
    with th.no_grad():
        model.policy.value_net.weight[0, 3] = -2 * WEIGHT_LIMIT
    model.save(tmp_path / "heavy.zip")
    assert main(["doctor", "--json", str(tmp_path / "heavy.zip")]) == EXIT_UNHEALTHY
    report = json.loads(capsys.readouterr().out)
    assert report["healthy"] is False and report["nonfinite"] == []
    (beyond,) = report["beyond_limits"]
    assert beyond["name"] == "policy.value_net.weight" and beyond["value"] == 2 * WEIGHT_LIMIT
    assert beyond["limit"] == WEIGHT_LIMIT and report["limits"]["weight"] == WEIGHT_LIMIT


def test_directory_exits_2_and_names_its_models(healthy_zip: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["doctor", str(healthy_zip.parent)]) == EXIT_UNREADABLE
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(
        f"sb3-safe doctor: error: {healthy_zip.parent}: is a directory; pass the model's .zip (it holds "
    )
    assert "healthy.zip" in captured.err and captured.err.count("\n") == 1


def test_inf_optimizer_state_and_variable_are_named(tmp_path: Path) -> None:
    model = SAC("MlpPolicy", "Pendulum-v1", learning_starts=8, batch_size=8, buffer_size=50, policy_kwargs=dict(net_arch=[8]))
    model.learn(12)
    with th.no_grad():
        model.log_ent_coef.fill_(math.inf)
        first_state = next(iter(model.critic.optimizer.state.values()))
        first_state["exp_avg_sq"].view(-1)[0] = -math.inf
    model.save(tmp_path / "sac.zip")
    names = [bad.name for bad in diagnose(tmp_path / "sac.zip").nonfinite]
    # by parameter name, as NonFiniteGuardCallback names optimizer state
    assert names == ["critic.optimizer.state[policy.critic.qf0.0.weight].exp_avg_sq", "log_ent_coef"]


def test_json_report(corrupted_zip: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["doctor", "--json", "--top", "2", str(corrupted_zip)]) == EXIT_UNHEALTHY
    report = json.loads(capsys.readouterr().out)
    assert report["healthy"] is False and report["num_timesteps"] == 32
    assert report["nonfinite"] == [{"name": "policy.mlp_extractor.policy_net.0.weight", "n_nan": 1, "n_inf": 0, "numel": 48}]
    assert len(report["largest"]) == 2 and report["largest"][0]["max_abs"] == "nan"


def _write_zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, content in members.items():
            archive.writestr(name, content)
    return path


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda d: d / "missing.zip", "no such file"),
        (lambda d: (d / "notes.txt").write_text("not a model") and d / "notes.txt", "not a zip archive"),
        (lambda d: _write_zip(d / "other.zip", {"readme.txt": b"hello"}), "without policy.pth"),
        (
            lambda d: _write_zip(d / "damaged.zip", {"data": b"{}", "policy.pth": b"\x00garbage"}),
            "policy.pth: not a torch file",
        ),
    ],
)
def test_unreadable_files_exit_2_with_one_line(make, reason: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = make(tmp_path)
    assert main(["doctor", str(path)]) == EXIT_UNREADABLE
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("sb3-safe doctor: error: ") and reason in captured.err
    assert captured.err.count("\n") == 1


def test_python_m_entry_point_exits_with_the_status(corrupted_zip: Path, tmp_path: Path) -> None:
    not_a_model = tmp_path / "model.zip"
    not_a_model.write_bytes(b"\x89PNG not a zip")
    for path, status in ((corrupted_zip, EXIT_UNHEALTHY), (not_a_model, EXIT_UNREADABLE)):
        result = subprocess.run([sys.executable, "-m", "sb3_safe", "doctor", str(path)], capture_output=True, text=True)
        assert result.returncode == status
        assert "Traceback" not in result.stderr


def test_maskable_and_recurrent_models(tmp_path: Path) -> None:
    """doctor reads MaskablePPO and RecurrentPPO zips with the safe policies, and names what is wrong in them."""
    maskable = MaskablePPO(SafeMaskableMlpPolicy, InvalidActionEnvDiscrete(dim=10, n_invalid_actions=3), n_steps=64)
    maskable.save(tmp_path / "maskable.zip")
    assert diagnose(tmp_path / "maskable.zip").healthy
    with th.no_grad():
        maskable.policy.action_net.weight[0, 0] = math.nan
    maskable.save(tmp_path / "maskable_nan.zip")
    (bad,) = diagnose(tmp_path / "maskable_nan.zip").nonfinite
    assert bad.name == "policy.action_net.weight"

    recurrent = RecurrentPPO(SafeMlpLstmPolicy, "Pendulum-v1", n_steps=64, policy_kwargs=dict(log_std_range=(-3.0, 1.0)))
    recurrent.save(tmp_path / "recurrent.zip")
    report = diagnose(tmp_path / "recurrent.zip")
    assert report.healthy and report.log_std_limits == (-3.0, 1.0)
    with th.no_grad():
        recurrent.policy.log_std.fill_(1.5)  # above the policy's own range: the projection was bypassed
    recurrent.save(tmp_path / "recurrent_above.zip")
    (beyond,) = diagnose(tmp_path / "recurrent_above.zip").beyond_limits
    assert beyond.name == "policy.log_std" and beyond.limit == 1.0


def test_value_normalization_statistics_are_not_weights(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """normalize_value's statistics of returns in the millions (a count, a mean) are no weight beyond the limit."""
    env = gym.wrappers.TransformReward(gym.make("CartPole-v1"), lambda reward: reward * 1e6)
    model = KLAdaptivePPO("MlpPolicy", env, n_steps=128, batch_size=64, n_epochs=1, normalize_value=True, seed=0)
    model.learn(256)
    statistics = {name: buffer for name, buffer in model.policy.named_buffers() if name.startswith("value_net.return_")}
    assert max(buffer.abs().max().item() for buffer in statistics.values()) > WEIGHT_LIMIT  # as the test needs
    model.save(tmp_path / "scaled.zip")
    report = diagnose(tmp_path / "scaled.zip")
    assert report.beyond_limits == []
    assert not any(name.rpartition(".")[2] in statistics for name, _ in report.largest)
    assert main(["doctor", str(tmp_path / "scaled.zip")]) == EXIT_HEALTHY
    # A non-finite statistic is still named
    model.policy.value_net.return_var.fill_(float("nan"))
    model.save(tmp_path / "broken.zip")
    assert main(["doctor", str(tmp_path / "broken.zip")]) == EXIT_UNHEALTHY
    assert "value_net.return_var" in capsys.readouterr().out


@pytest.mark.parametrize("policy", ["MlpPolicy", SafeMaskableMlpPolicy], ids=["PPO-CartPole", "MaskablePPO-safe"])
def test_discrete_policy_report_names_only_what_applies(policy: object, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A policy without log_std (discrete actions) gets no log-std limits, nor a line saying it has no log_std."""
    if policy == "MlpPolicy":
        model = PPO(policy, "CartPole-v1", n_steps=32, policy_kwargs=dict(net_arch=[8]), seed=0)
    else:
        model = MaskablePPO(policy, InvalidActionEnvDiscrete(dim=10, n_invalid_actions=3), n_steps=32, seed=0)
    model.save(tmp_path / "discrete.zip")
    assert main(["doctor", str(tmp_path / "discrete.zip")]) == EXIT_HEALTHY
    out = capsys.readouterr().out
    assert f"Limits: |weight| <= {WEIGHT_LIMIT:.4g}" in out
    assert "log-std" not in out and "log_std" not in out, out
