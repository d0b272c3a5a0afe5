"""
Quickstart: SB3's PPO with a safe policy, a drop-in for ``"MlpPolicy"``.

Trains on CartPole-v1 with rl-zoo's tuned PPO hyperparameters, shows a progress bar, saves the model and a
learning-curve PNG, and prints the evaluation::

    python examples/quickstart.py                      # about 1-2 minutes on 2 CPU cores
    python examples/quickstart.py --timesteps 2000     # smoke run
"""

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.monitor import load_results
from stable_baselines3.common.utils import LinearSchedule

from sb3_safe import SafeMlpPolicy


def plot_learning_curve(monitor_dir: Path, path: Path, title: str) -> None:
    episodes = load_results(str(monitor_dir)).sort_values("t")
    timesteps = np.cumsum(episodes["l"].to_numpy())
    returns = episodes["r"].to_numpy()
    window = max(1, min(20, len(returns) // 5))
    smoothed = np.convolve(returns, np.ones(window) / window, mode="valid")
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(timesteps, returns, alpha=0.3, label="episode return")
    ax.plot(timesteps[window - 1 :], smoothed, label=f"mean of {window}")
    ax.set(xlabel="timesteps", ylabel="return", title=title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timesteps", type=int, default=50_000, help="training budget")
    parser.add_argument("--output", type=Path, default=Path("runs/quickstart"), help="folder for model, logs and plot")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    monitor_dir = args.output / "monitor"
    monitor_dir.mkdir(parents=True, exist_ok=True)
    env = make_vec_env("CartPole-v1", n_envs=8, seed=args.seed, monitor_dir=str(monitor_dir))
    # rl-baselines3-zoo hyperparams/ppo.yml, CartPole-v1
    model = PPO(
        SafeMlpPolicy,
        env,
        n_steps=32,
        batch_size=256,
        gae_lambda=0.8,
        gamma=0.98,
        n_epochs=20,
        ent_coef=0.0,
        learning_rate=LinearSchedule(1e-3, 0.0, 1.0),
        clip_range=LinearSchedule(0.2, 0.0, 1.0),
        seed=args.seed,
    )
    model.learn(args.timesteps, progress_bar=True)

    model_path = args.output / "ppo_safe_cartpole.zip"
    model.save(model_path)
    plot_path = args.output / "learning_curve.png"
    plot_learning_curve(monitor_dir, plot_path, f"PPO + SafeMlpPolicy on CartPole-v1, seed {args.seed}")

    eval_env = make_vec_env("CartPole-v1", n_envs=1, seed=args.seed + 1000)
    mean_return, std_return = evaluate_policy(PPO.load(model_path), eval_env, n_eval_episodes=10, deterministic=True)
    print(f"saved model: {model_path}")
    print(f"saved learning curve: {plot_path}")
    print(f"evaluation over 10 episodes: mean return {mean_return:.1f} +/- {std_return:.1f}")


if __name__ == "__main__":
    main()
