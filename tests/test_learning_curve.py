"""`learning_curve.png`'s data on known Monitor logs: smoothed over timesteps, with rl_zoo3's evaluations marked."""

from pathlib import Path

import numpy as np
import pytest
from stable_baselines3.common.monitor import ResultsWriter

from sb3_safe.zoo import EVALUATIONS, LEARNING_CURVE, learning_curve_data, plot_learning_curve, smooth_over_timesteps

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# 100 short bad episodes (1,000 steps), then 20 long perfect ones (10,000 steps): CartPole learning to balance
SHORT, LONG = (10, 10.0), (500, 500.0)
EPISODES = [SHORT] * 100 + [LONG] * 20


def write_monitor(folder: Path, episodes: list[tuple[int, float]], name: str = "0") -> None:
    """A Monitor log, written by SB3's own writer: one ``(length, return)`` per finished episode, in order."""
    writer = ResultsWriter(str(folder / name), header={"t_start": 0.0, "env_id": "CartPole-v1"})
    for i, (length, episode_return) in enumerate(episodes):
        writer.write_row({"r": episode_return, "l": length, "t": float(i)})
    writer.close()


def test_smoothing_is_a_mean_over_a_window_of_timesteps() -> None:
    timesteps, values = np.array([10.0, 20.0, 30.0, 100.0]), np.array([1.0, 2.0, 3.0, 4.0])
    # Windows (t - 15, t]: {10}, {10, 20}, {20, 30}, {100}
    np.testing.assert_allclose(smooth_over_timesteps(timesteps, values, 15.0), [1.0, 1.5, 2.5, 4.0])
    np.testing.assert_allclose(smooth_over_timesteps(timesteps, values, 1e9), [1.0, 1.5, 2.0, 2.5])


def test_smoothed_line_tracks_long_episodes(tmp_path: Path) -> None:
    write_monitor(tmp_path, EPISODES)
    curve = learning_curve_data(tmp_path)
    assert curve is not None
    lengths = np.array([length for length, _ in EPISODES])
    np.testing.assert_array_equal(curve.timesteps, np.cumsum(lengths))
    np.testing.assert_array_equal(curve.returns, [episode_return for _, episode_return in EPISODES])
    # Default window: 5% of the run's 11,000 timesteps
    assert curve.window == pytest.approx(550.0)
    # A mean over the last 100 episodes (SB3's plotter) would still say 108 at the end: 80 short and 20 long
    assert np.mean(curve.returns[-100:]) == pytest.approx(108.0)
    # Over 550 timesteps the line is at 500 (tolerance 1e-6) from the second long episode on, exactly where the
    # points are; the first one's window still holds the last 5 short episodes
    assert curve.smoothed[99] == pytest.approx(10.0, abs=1e-6)
    assert curve.smoothed[100] == pytest.approx((5 * 10.0 + 500.0) / 6, abs=1e-6)
    np.testing.assert_allclose(curve.smoothed[101:], 500.0, atol=1e-6)
    # Without evaluations.npz: no evaluation markers
    assert curve.eval_timesteps.size == curve.eval_means.size == curve.eval_stds.size == 0


def test_several_environments_logs_are_merged_in_time(tmp_path: Path) -> None:
    # rl_zoo3 writes one Monitor log per environment; SB3 orders their episodes by the time they ended
    write_monitor(tmp_path, [SHORT] * 50 + [LONG] * 10, name="0")
    write_monitor(tmp_path, [SHORT] * 50 + [LONG] * 10, name="1")
    curve = learning_curve_data(tmp_path, window=1000.0)
    assert curve is not None and curve.window == 1000.0
    assert curve.timesteps[-1] == 11000
    assert curve.smoothed[-1] == pytest.approx(500.0, abs=1e-6)


def test_evaluations_are_read_from_evaluations_npz(tmp_path: Path) -> None:
    write_monitor(tmp_path, EPISODES)
    # As rl_zoo3's EvalCallback saves them: one row of episode returns per evaluation
    results = np.array([[100.0, 200.0, 300.0], [500.0, 500.0, 500.0]])
    np.savez(tmp_path / EVALUATIONS, timesteps=np.array([5000, 10000]), results=results, ep_lengths=results.astype(int))
    curve = learning_curve_data(tmp_path)
    assert curve is not None
    np.testing.assert_array_equal(curve.eval_timesteps, [5000.0, 10000.0])
    np.testing.assert_allclose(curve.eval_means, [200.0, 500.0])
    np.testing.assert_allclose(curve.eval_stds, [np.std([100.0, 200.0, 300.0]), 0.0])

    path = plot_learning_curve(tmp_path, "kl_ppo on CartPole-v1")
    assert path == tmp_path / LEARNING_CURVE
    assert path.read_bytes().startswith(PNG_MAGIC)


def test_no_finished_episode_gives_no_curve(tmp_path: Path) -> None:
    write_monitor(tmp_path, [])
    assert learning_curve_data(tmp_path) is None
    assert plot_learning_curve(tmp_path, "no episode") is None
    assert not (tmp_path / LEARNING_CURVE).exists()
