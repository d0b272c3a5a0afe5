"""sb3-safe: numerically safe on-policy reinforcement learning for Stable-Baselines3."""

from pathlib import Path

from sb3_safe.common.numerics import NonFiniteError

__version__ = (Path(__file__).parent / "version.txt").read_text(encoding="utf-8").strip()

__all__ = [
    "NonFiniteError",
    "__version__",
]
