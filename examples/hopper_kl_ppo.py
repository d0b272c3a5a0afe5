"""
KLAdaptivePPO on Hopper-v5 (MuJoCo): PPO's clipped surrogate plus the adaptive KL penalty of the PPO paper, with
rl-zoo's tuned Hopper hyperparameters (the ``Hopper-v5`` entry of sb3-safe's ``zoo_configs/kl_ppo.yml``).

Prints the penalty coefficient beta as it adapts to the KL target, saves the model and its VecNormalize
statistics, reloads both and evaluates::

    python examples/hopper_kl_ppo.py                       # 100,000 steps (rl-zoo trains 1e6)
    python examples/hopper_kl_ppo.py --timesteps 1024      # smoke run

The same run through rl-zoo: ``sb3-safe train --algo kl_ppo --env Hopper-v5 -n 100000``.
"""

import argparse
from pathlib import Path

from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import VecNormalize
from torch import nn

from sb3_safe import KLAdaptivePPO, NonFiniteGuardCallback

ENV_ID = "Hopper-v5"
GAMMA = 0.999


class KLBetaPrinter(BaseCallback):
    """Print the KL penalty coefficient after every ``every`` updates (beta changes only after an update phase)."""

    def __init__(self, every: int):
        super().__init__()
        self.every = every
        self.n_rollouts = 0

    def _on_step(self) -> bool:
        return True

    def _on_rollout_start(self) -> None:
        if self.n_rollouts % self.every == 0:
            kl = self.logger.name_to_value.get("train/kl")
            measured = "" if kl is None else f", mean KL of the last update {kl:.4g}"
            print(f"{self.num_timesteps:>8} steps: beta {self.model.kl_beta:.4g}{measured}")
        self.n_rollouts += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timesteps", type=int, default=100_000, help="training budget")
    parser.add_argument("--output", type=Path, default=Path("runs/hopper_kl_ppo"), help="folder for model and statistics")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--print-every", type=int, default=20, help="print beta after every this many updates")
    args = parser.parse_args()

    # rl-zoo normalizes observations and rewards for MuJoCo, discounting the reward statistics with the agent's gamma
    env = VecNormalize(make_vec_env(ENV_ID, n_envs=1, seed=args.seed), gamma=GAMMA)
    # rl-baselines3-zoo hyperparams/ppo.yml, Hopper-v4 (tuned); KLAdaptivePPO's KL target 0.01 and beta 1 (defaults)
    model = KLAdaptivePPO(
        "MlpPolicy",
        env,
        n_steps=512,
        batch_size=32,
        gamma=GAMMA,
        learning_rate=9.80828e-05,
        ent_coef=0.00229519,
        clip_range=0.2,
        n_epochs=5,
        gae_lambda=0.99,
        max_grad_norm=0.7,
        vf_coef=0.835671,
        policy_kwargs=dict(
            log_std_init=-2, ortho_init=False, activation_fn=nn.ReLU, net_arch=dict(pi=[256, 256], vf=[256, 256])
        ),
        seed=args.seed,
    )
    guard = NonFiniteGuardCallback(on_nonfinite="rollback")
    model.learn(args.timesteps, callback=[guard, KLBetaPrinter(every=args.print_every)])
    kl = model.logger.name_to_value.get("train/kl")
    measured = "" if kl is None else f" (mean KL of the last update {kl:.4g})"
    skipped = model.skipped_updates
    print(f"final beta {model.kl_beta:.4g}{measured}; skipped optimizer steps {skipped}; rollbacks {guard.n_rollbacks}")

    args.output.mkdir(parents=True, exist_ok=True)
    model_path, stats_path = args.output / "kl_ppo_hopper.zip", args.output / "vecnormalize.pkl"
    model.save(model_path)
    env.save(str(stats_path))

    # Evaluate with the saved statistics, frozen, on unnormalized rewards
    eval_env = VecNormalize.load(str(stats_path), make_vec_env(ENV_ID, n_envs=1, seed=args.seed + 1000))
    eval_env.training, eval_env.norm_reward = False, False
    mean_return, std_return = evaluate_policy(KLAdaptivePPO.load(model_path), eval_env, n_eval_episodes=5)
    print(f"saved model: {model_path}")
    print(f"saved VecNormalize statistics: {stats_path}")
    print(f"evaluation over 5 episodes: mean return {mean_return:.1f} +/- {std_return:.1f}")


if __name__ == "__main__":
    main()
