"""
Quickstart: SB3's PPO with a safe policy, a drop-in for ``"MlpPolicy"``.

Trains on CartPole-v1 with rl-zoo's tuned PPO hyperparameters, shows a progress bar, saves the model and a
learning-curve PNG, and prints the evaluation::

    python examples/quickstart.py                      # about 1-2 minutes on 2 CPU cores
    python examples/quickstart.py --timesteps 2000     # smoke run
"""

import argparse
from pathlib import Path

from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.utils import LinearSchedule

from sb3_safe import SafeMlpPolicy
from sb3_safe.zoo import plot_learning_curve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timesteps", type=int, default=50_000, help="training budget")
    parser.add_argument("--output", type=Path, default=Path("runs/quickstart"), help="folder for model, logs and plot")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    args.output.mkdir(parents=True, exist_ok=True)
    env = make_vec_env("CartPole-v1", n_envs=8, seed=args.seed, monitor_dir=str(args.output))
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
    plot_path = plot_learning_curve(args.output, f"PPO + SafeMlpPolicy on CartPole-v1, seed {args.seed}")

    eval_env = make_vec_env("CartPole-v1", n_envs=1, seed=args.seed + 1000)
    mean_return, std_return = evaluate_policy(PPO.load(model_path), eval_env, n_eval_episodes=10, deterministic=True)
    print(f"saved model: {model_path}")
    print(f"saved learning curve: {plot_path}")
    print(f"evaluation over 10 episodes: mean return {mean_return:.1f} +/- {std_return:.1f}")


if __name__ == "__main__":
    main()
