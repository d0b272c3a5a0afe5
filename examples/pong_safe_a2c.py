"""
SafeA2C on Pong through rl-zoo: rl_zoo3's trainer runs the ``atari`` entry of sb3-safe's
``zoo_configs/safe_a2c.yml`` (rl-zoo's A2C Atari setting: AtariWrapper, 4 stacked frames, NatureCNN with bounded
logits, 16 environments, RMSpropTFLike), then the saved model is evaluated and the learning curve plotted::

    python examples/pong_safe_a2c.py                      # rl-zoo's budget: 10M steps, hours of CPU time
    python examples/pong_safe_a2c.py --timesteps 80       # smoke run: one update of 16 x 5 steps

The same as ``sb3-safe train --algo safe_a2c --env PongNoFrameskip-v4 -n <timesteps> -f <output> -P``; this script
shows the Python entry point, :func:`sb3_safe.zoo.train`, which takes rl_zoo3's command-line arguments.
"""

import argparse
from pathlib import Path

from sb3_safe.zoo import train

ENV_ID = "PongNoFrameskip-v4"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timesteps", type=int, default=10_000_000, help="training budget")
    parser.add_argument("--output", type=Path, default=Path("runs/pong_safe_a2c"), help="rl_zoo3 log folder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-episodes", type=int, default=5, help="episodes of the final evaluation")
    args = parser.parse_args()

    zoo_args = ["--algo", "safe_a2c", "--env", ENV_ID, "-n", str(args.timesteps), "-f", str(args.output)]
    # rl_zoo3's periodic evaluation every 100,000 steps (16 environments: every 6,250 steps of each)
    zoo_args += ["--seed", str(args.seed), "--eval-freq", "100000", "--verbose", "0"]
    zoo_args += ["--eval-episodes", str(args.eval_episodes)]
    report = train(zoo_args)
    assert report is not None, "rl_zoo3 saved no model"
    # Atari is evaluated with stochastic actions, as rl_zoo3 does: a deterministic policy can stall a game
    print(report.summary())


if __name__ == "__main__":
    main()
