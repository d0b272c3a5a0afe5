"""
What ``sb3-safe train`` shows after a run: the learning curve (training episodes smoothed over timesteps, and
rl_zoo3's periodic evaluations) and the evaluation of the saved model.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from huggingface_sb3 import EnvironmentName
from rl_zoo3 import ALGOS, create_test_env
from rl_zoo3.exp_manager import ExperimentManager
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.monitor import load_results
from stable_baselines3.common.results_plotter import X_TIMESTEPS, ts2xy

from sb3_safe.loading import load, secure_reading
from sb3_safe.zoo.run_folder import RunFolderError, read_args, saved_hyperparams

#: file name of the learning curve written into the run folder
LEARNING_CURVE = "learning_curve.png"
#: file name of the results of rl_zoo3's periodic evaluation (``--eval-freq`` > 0) in the run folder
EVALUATIONS = "evaluations.npz"
#: the learning curve's smoothing window, as a fraction of the run's timesteps
SMOOTHING_FRACTION = 0.05


@dataclass
class RunReport:
    """
    The result of a finished ``sb3-safe train`` run.

    :param model_path: the saved model
    :param learning_curve: the learning-curve PNG, or None if no training episode finished
    :param episode_returns: the return of each evaluation episode of the saved model
    :param deterministic: whether the evaluation used deterministic actions
    """

    model_path: Path
    learning_curve: Path | None
    episode_returns: list[float]
    deterministic: bool

    def summary(self) -> str:
        """Three lines: the model, the learning curve and the evaluation."""
        returns = self.episode_returns
        actions = "deterministic" if self.deterministic else "stochastic"
        return (
            f"saved model: {self.model_path}\n"
            f"learning curve: {self.learning_curve or 'none (no training episode finished)'}\n"
            f"evaluation over {len(returns)} episodes ({actions}): "
            f"mean return {np.mean(returns):.1f} +/- {np.std(returns):.1f}"
        )


@dataclass
class LearningCurve:
    """
    What the learning curve shows: the training episodes that rl_zoo3's ``Monitor`` wrappers logged in a run folder,
    smoothed over timesteps, and rl_zoo3's periodic evaluations.

    :param timesteps: the timestep at which each training episode ended (the lengths of the episodes summed in the
        order they ended, as SB3's plotter counts)
    :param returns: each training episode's return
    :param smoothed: at each episode's end, the mean return of the episodes that ended within the last ``window``
        timesteps
    :param window: the smoothing window, in timesteps
    :param eval_timesteps: the timestep of each evaluation (none without ``evaluations.npz``)
    :param eval_means: the mean return of each evaluation's episodes
    :param eval_stds: the standard deviation of each evaluation's episode returns
    """

    timesteps: np.ndarray
    returns: np.ndarray
    smoothed: np.ndarray
    window: float
    eval_timesteps: np.ndarray
    eval_means: np.ndarray
    eval_stds: np.ndarray


def smooth_over_timesteps(timesteps: np.ndarray, values: np.ndarray, window: float) -> np.ndarray:
    """
    A moving mean over a window of timesteps rather than of episodes: a window of N episodes spans few timesteps
    where episodes are short and many where they are long, so it lags most where the agent has improved most.

    :param timesteps: increasing timesteps, one per value
    :param values: the values
    :param window: the window's width in timesteps (> 0)
    :return: at each timestep ``t``, the mean of the values at timesteps in ``(t - window, t]``
    """
    # The window of point i starts at the first point after t_i - window; a prefix sum gives each window's sum
    starts = np.searchsorted(timesteps, timesteps - window, side="right")
    ends = np.arange(1, len(values) + 1)
    sums = np.concatenate([[0.0], np.cumsum(values, dtype=np.float64)])
    return (sums[ends] - sums[starts]) / (ends - starts)


def learning_curve_data(run_folder: Path, window: float | None = None) -> LearningCurve | None:
    """
    The data of a run's learning curve.

    :param run_folder: the run folder (``<log folder>/<algo>/<env>_<id>``), with the ``Monitor`` logs and, with
        ``--eval-freq`` > 0, rl_zoo3's ``evaluations.npz``
    :param window: the smoothing window in timesteps; None: :data:`SMOOTHING_FRACTION` of the run's timesteps
    :return: the curve, or None if no training episode finished
    """
    monitor = load_results(str(run_folder))
    if monitor.empty:
        return None
    timesteps, returns = (np.asarray(column, dtype=np.float64) for column in ts2xy(monitor, X_TIMESTEPS))
    if window is None:
        window = max(SMOOTHING_FRACTION * timesteps[-1], 1.0)
    eval_timesteps, eval_means, eval_stds = np.zeros(0), np.zeros(0), np.zeros(0)
    if (run_folder / EVALUATIONS).is_file():
        with np.load(run_folder / EVALUATIONS) as evaluations:
            eval_timesteps = np.asarray(evaluations["timesteps"], dtype=np.float64)
            # EvalCallback's results: one row of episode returns per evaluation
            results = np.asarray(evaluations["results"], dtype=np.float64)
        eval_means, eval_stds = results.mean(axis=1), results.std(axis=1)
    smoothed = smooth_over_timesteps(timesteps, returns, window)
    return LearningCurve(timesteps, returns, smoothed, window, eval_timesteps, eval_means, eval_stds)


def plot_learning_curve(run_folder: Path, title: str) -> Path | None:
    """
    Plot a run's learning curve (:func:`learning_curve_data`): each training episode's return, their mean over a
    window of timesteps, and rl_zoo3's evaluations.

    :param run_folder: the run folder (``<log folder>/<algo>/<env>_<id>``)
    :param title: the plot title
    :return: the PNG written into the run folder, or None if no episode finished
    """
    curve = learning_curve_data(run_folder)
    if curve is None:
        return None
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.scatter(curve.timesteps, curve.returns, s=6, alpha=0.3, color="tab:blue", label="training episode")
    ax.plot(curve.timesteps, curve.smoothed, color="tab:blue", label=f"mean over {curve.window:,.0f} timesteps")
    if len(curve.eval_timesteps):
        ax.errorbar(
            curve.eval_timesteps,
            curve.eval_means,
            yerr=curve.eval_stds,
            fmt="D",
            color="tab:orange",
            capsize=3,
            label="evaluation (mean +/- std)",
        )
    ax.set(xlabel="timesteps", ylabel="episode return", title=title)
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    path = run_folder / LEARNING_CURVE
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _zero(_: float) -> float:
    return 0.0


def report_run(run_folder: Path, algo: str, env_id: str, trust: Sequence[str] = ()) -> RunReport:
    """
    Plot the learning curve of a finished rl_zoo3 run and evaluate its saved model on an environment built as
    rl_zoo3's ``enjoy`` builds it (same wrappers, frame stacking and saved VecNormalize statistics). The run folder
    is read as ``sb3-safe enjoy`` reads it: as data (:mod:`sb3_safe.zoo.run_folder`), its pickles by
    :func:`sb3_safe.load`.

    :param run_folder: the run folder (``<log folder>/<algo>/<env>_<id>``)
    :param algo: the zoo algorithm name
    :param env_id: the environment id
    :param trust: modules (or packages) of your own whose classes the run's files may name
    :return: the report; the number of episodes is the run's ``--eval-episodes``
    :raises RunFolderError: for a ``config.yml`` / ``args.yml`` that would run code
    :raises RefusedFileError: for a model or ``vecnormalize.pkl`` that names or calls more than SB3 files need
    """
    env_name = EnvironmentName(env_id)
    params_path = run_folder / env_name
    args = read_args(params_path, trust)
    if args is None:
        raise RunFolderError(params_path / "args.yml", None, "missing")
    hyperparams, stats_path = saved_hyperparams(str(params_path), test_mode=True, trust=trust)
    # Command-line env_kwargs override the configuration's, as in rl_zoo3
    env_kwargs = args["env_kwargs"] or hyperparams.get("env_kwargs") or {}
    with secure_reading(trust):
        env = create_test_env(
            env_id,
            stats_path=stats_path,
            seed=args["seed"],
            should_render=False,
            hyperparams=hyperparams,
            env_kwargs=env_kwargs,
        )
    model_path = run_folder / f"{env_name}.zip"
    # As rl_zoo3's enjoy: schedules (lin_ rates are closures) are not needed to act, and would be refused
    schedules = {"learning_rate": 0.0, "lr_schedule": _zero, "clip_range": _zero}
    model = load(ALGOS[algo], model_path, device=args["device"], custom_objects=schedules, trust=trust)
    # rl_zoo3's choice: stochastic actions on Atari and MiniGrid, where deterministic policies can get stuck
    deterministic = not (ExperimentManager.is_atari(env_id) or ExperimentManager.is_minigrid(env_id))
    returns, _ = evaluate_policy(
        model, env, n_eval_episodes=args["eval_episodes"], deterministic=deterministic, return_episode_rewards=True
    )
    env.close()
    assert isinstance(returns, list)  # with return_episode_rewards=True
    curve = plot_learning_curve(run_folder, f"{algo} on {env_id} ({run_folder.name})")
    return RunReport(model_path, curve, [float(r) for r in returns], deterministic)
