"""
Drop-in: a safe policy takes stock SB3's steps wherever no bound binds. Each on-policy algorithm trains SB3's policy
and the safe one with the same seed and settings on Pendulum-v1 (CPU, one torch thread) for ``UPDATES`` rollout +
update phases, with and without gSDE; a row is the largest absolute difference between their parameters (0: bit for
bit). The settings are ``tests/test_drop_in_parity.py``'s, which holds the same runs to their bounds (and checks the
other policies: Dict and image observations, categorical actions, state dicts loading both ways).
"""

import time
from pathlib import Path
from typing import Any

import torch as th
from sb3_contrib import TRPO, RecurrentPPO
from stable_baselines3 import A2C, PPO
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm

from benchmarks import reports, suite
from sb3_safe import SafeMlpLstmPolicy, SafeMlpPolicy

SUITE = "drop_in"
ENV_ID = "Pendulum-v1"
SEED = 3
#: rollout + update phases each pair trains for
UPDATES = {"tiny": 2, "quick": 10, "full": 10}
#: name -> (algorithm, SB3's policy, the safe policy, settings)
ALGORITHMS: dict[str, tuple[type[OnPolicyAlgorithm], str, type, dict[str, Any]]] = {
    "PPO": (PPO, "MlpPolicy", SafeMlpPolicy, dict(n_steps=32, batch_size=32, n_epochs=2)),
    "A2C": (A2C, "MlpPolicy", SafeMlpPolicy, dict(n_steps=8)),
    "TRPO": (TRPO, "MlpPolicy", SafeMlpPolicy, dict(n_steps=64, batch_size=32, n_critic_updates=2, cg_max_steps=5)),
    "RecurrentPPO": (RecurrentPPO, "MlpLstmPolicy", SafeMlpLstmPolicy, dict(n_steps=32, batch_size=32, n_epochs=2)),
}
#: (algorithm, gSDE, updates)
Job = tuple[str, bool, int]


def jobs(size: str) -> list[Job]:
    """Every algorithm with and without gSDE (tiny: PPO only, two updates)."""
    names = ("PPO",) if size == "tiny" else tuple(ALGORITHMS)
    return [(name, use_sde, UPDATES[size]) for name in names for use_sde in (False, True)]


def job_key(job: Job) -> tuple[str, bool]:
    """What identifies a pair (a rerun with the same ``--out`` skips those written)."""
    return job[0], job[1]


def row_key(row: dict[str, Any]) -> tuple[str, bool]:
    """:func:`job_key` of the job that wrote ``row``."""
    return row["algorithm"], row["use_sde"]


def _train(algorithm: type[OnPolicyAlgorithm], policy: Any, settings: dict[str, Any], updates: int) -> OnPolicyAlgorithm:
    # Built just before it learns: the seed is global, so building the second model first would reseed the first's run
    model = algorithm(policy, ENV_ID, seed=SEED, device="cpu", **settings)
    model.learn(updates * model.n_steps * model.n_envs)
    return model


def run_job(job: Job) -> list[dict[str, Any]]:
    """Train SB3's policy, then the safe one, with the same seed; the largest parameter difference between them."""
    name, use_sde, updates = job
    algorithm, stock_policy, safe_policy, settings = ALGORITHMS[name]
    start = time.perf_counter()
    stock = _train(algorithm, stock_policy, dict(settings, use_sde=use_sde), updates)
    safe = _train(algorithm, safe_policy, dict(settings, use_sde=use_sde), updates)
    stock_parameters, safe_parameters = dict(stock.policy.named_parameters()), dict(safe.policy.named_parameters())
    same_names = list(safe_parameters) == list(stock_parameters)
    with th.no_grad():
        difference = (
            max(float((safe_parameters[key] - stock_parameters[key]).abs().max()) for key in stock_parameters)
            if same_names
            else None
        )
    return [
        dict(
            algorithm=name,
            use_sde=use_sde,
            env=ENV_ID,
            seed=SEED,
            updates=updates,
            same_state_dict_keys=list(safe.policy.state_dict()) == list(stock.policy.state_dict()),
            max_abs_difference=difference,
            wall_s=time.perf_counter() - start,
        )
    ]


def budget(size: str) -> dict[str, Any]:
    """The pairs recorded in the JSONL meta row (a resumed run must have the same)."""
    return dict(env=ENV_ID, seed=SEED, updates=UPDATES[size], algorithms=sorted({job[0] for job in jobs(size)}))


def _difference(row: dict[str, Any] | None) -> str:
    if row is None:
        return "not run"
    if row["max_abs_difference"] is None:
        return "parameter names differ"
    return "0 (bit for bit)" if row["max_abs_difference"] == 0.0 else f"{row['max_abs_difference']:.1e}"


def report(out: Path) -> None:
    """``drop_in.md``: the claim and its figure, the method, then the difference per algorithm and gSDE."""
    meta, rows = suite.read_jsonl(out / f"{SUITE}.jsonl")
    by_key = {row_key(row): row for row in rows}
    names = [name for name in ALGORITHMS if any(row["algorithm"] == name for row in rows)]
    plain = [by_key[name, False] for name in names if (name, False) in by_key]
    sde = [by_key[name, True] for name in names if (name, True) in by_key]
    bit_for_bit = [row["algorithm"] for row in plain if row["max_abs_difference"] == 0.0]
    updates = meta.get("budget", {}).get("updates")
    figure = (
        f"**Without gSDE, {len(bit_for_bit)} of {len(plain)} algorithms ({', '.join(bit_for_bit) or 'none'}) end with"
        f" stock's parameters bit for bit after {updates} updates; with gSDE: "
        + ", ".join(f"{row['algorithm']} {_difference(row)}" for row in sde)
        + ".**"
    )
    lines = reports.report_header(
        "Drop-in: the safe policies take stock SB3's steps",
        meta,
        [
            f"Each algorithm trains SB3's policy and the safe one (`SafeMlpPolicy`, `SafeMlpLstmPolicy` for"
            f" RecurrentPPO) on {ENV_ID}, seed {SEED}, {updates} rollout + update phases, one after the other in one"
            " process (`benchmarks/drop_in.py`; the settings of `tests/test_drop_in_parity.py`, which holds them to"
            " their bounds); a row: the largest absolute difference between the two policies' parameters.",
        ],
        summary=figure,
    )
    lines += reports.table(
        ["algorithm", "without gSDE", "with gSDE", "state_dict keys SB3's"],
        [
            [
                name,
                _difference(by_key.get((name, False))),
                _difference(by_key.get((name, True))),
                "yes" if all(row["same_state_dict_keys"] for row in rows if row["algorithm"] == name) else "no",
            ]
            for name in names
        ],
    )
    lines += [
        "",
        "Caveats: one seed and one environment, where no bound of the safe policy binds (the log-std stays inside its"
        " range). With gSDE the safe distribution computes the noise's std in float64 without SB3's +1e-6 variance"
        " epsilon (so that its sampler and its log-prob agree for every std): a rounding difference, which TRPO's"
        " conjugate-gradient solve amplifies from update to update.",
    ]
    reports.write_report(out / f"{SUITE}.md", lines)
