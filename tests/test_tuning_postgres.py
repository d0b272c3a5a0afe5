"""
Tuning across machines on a real PostgreSQL server: the zoo guide's "Tuning across machines" commands, two
``sb3-safe train -optimize`` workers filling one study at the same time, then ``--trial-id`` training a trial's values.

The server runs PostgreSQL's binaries from the ``pgserver`` package (the ``test`` extra) in a temporary folder,
listening on 127.0.0.1 only, on a free port, with its unix socket in that folder; the fixture stops it and removes the
folder, also when the test fails.
"""

import importlib.util
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import psycopg
import pytest
from snippets import docs_blocks

from sb3_safe import KLAdaptivePPO
from sb3_safe.cli import EXIT_USAGE, main
from sb3_safe.zoo import open_storage

ROOT = Path(__file__).resolve().parent.parent
SB3_SAFE = str(Path(sys.executable).parent / "sb3-safe")
# One torch thread per process: two workers share 2 cores
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
# Small rollouts (64 steps of 8 CartPoles) and one epoch keep each trial to a second or two; the rest is sampled
SMALL_TRIAL = {"n_steps_pow": 6, "batch_size_pow": 6, "n_epochs": 1, "net_arch": "tiny"}
N_WORKERS, TRIALS_PER_WORKER = 2, 2
TIMEOUT = 180


def _pginstall() -> Path:
    """pgserver's PostgreSQL installation: bin/ (initdb, pg_ctl, postgres, createdb), lib/, share/."""
    # Found, not imported: importing pgserver sets up its own server management, unused here
    spec = importlib.util.find_spec("pgserver")
    if spec is None or spec.origin is None:
        pytest.fail("no pgserver, the PostgreSQL binaries of the test extra: pip install -e '.[test]'")
    return Path(spec.origin).parent / "pginstall"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _server_user() -> dict[str, Any]:
    """subprocess keywords that run the server's commands as an unprivileged user, if this is root."""
    if os.geteuid() != 0:
        return {}
    # PostgreSQL refuses to run as root
    nobody = pwd.getpwnam("nobody")
    return {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}


class _Server:
    """A throwaway PostgreSQL server in ``base``, listening on 127.0.0.1:``port``."""

    def __init__(self, base: Path) -> None:
        self.run_as = _server_user()
        pginstall = _pginstall()
        bin_dir = pginstall / "bin"
        if self.run_as:
            # The unprivileged user may not reach the checkout's folders: the binaries go into /tmp, their libraries
            # where they look for them (pgserver's wheel: $ORIGIN/../../../pgserver.libs)
            base.chmod(0o755)
            shutil.copytree(pginstall, base / "pgserver" / "pginstall", symlinks=True)
            libs = pginstall.parent.parent / "pgserver.libs"
            if libs.is_dir():
                shutil.copytree(libs, base / "pgserver.libs", symlinks=True)
            bin_dir = base / "pgserver" / "pginstall" / "bin"
        self.bin = bin_dir
        # Owned by the server's user: its data folder, its unix socket, its log
        self.home = base / "server"
        self.home.mkdir()
        if self.run_as:
            os.chown(self.home, self.run_as["user"], self.run_as["group"])
        self.data, self.log = self.home / "data", self.home / "postgres.log"
        self.port = _free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/optuna"

    def _run(self, program: str, *args: str) -> None:
        # pg_ctl's server keeps inherited pipes open: output to a file, so that run() returns
        with open(self.home / f"{program}.out", "a") as out:
            subprocess.run(
                [str(self.bin / program), *args],
                check=True,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.home,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"},
                timeout=60,
                **self.run_as,
            )

    def start(self) -> None:
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "--no-locale", "-E", "UTF8", "-N")
        # Loopback only, unix socket in the temporary folder; no fsync: the data is thrown away
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.home} -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "60", "start")
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "optuna")

    def stop(self) -> None:
        if not (self.data / "postmaster.pid").is_file():
            return  # not started, or stopped
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "30", "stop")
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            # The postmaster's pid is the first line of postmaster.pid; SIGQUIT: immediate shutdown
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
            os.kill(pid, signal.SIGQUIT)

    def output(self) -> str:
        """The server's log and its commands' output, for a failure message."""
        return "\n".join(f"--- {path.name}\n{path.read_text()[-3000:]}" for path in sorted(self.home.glob("*.out")))


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A PostgreSQL server's URL on 127.0.0.1, with an empty database ``optuna``."""
    # Not pytest's tmp_path: /tmp/pytest-of-root is closed to the unprivileged server user
    base = Path(tempfile.mkdtemp(prefix="sb3-safe-pg-"))
    server = None
    try:
        server = _Server(base)
        try:
            server.start()
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as error:
            pytest.fail(f"the PostgreSQL server did not start: {error}\n{server.output()}")
        yield server.url
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(base, ignore_errors=True)


def guide_commands() -> tuple[list[str], list[str]]:
    """
    The commands of the documentation's block marked for this test (the zoo guide's "Tuning across machines") as
    argv: the ``-optimize`` worker and the ``--trial-id`` run.
    """
    blocks = [block for block in docs_blocks() if block.checked == "tests/test_tuning_postgres.py runs these"]
    assert len(blocks) == 1, [f"{block.name} line {block.line}" for block in blocks]
    commands = [shlex.split(line) for line in blocks[0].lines]
    optimize = [command for command in commands if "-optimize" in command]
    trial = [command for command in commands if "--trial-id" in command]
    assert len(optimize) == len(trial) == 1 == len(commands) - 1, commands
    return optimize[0], trial[0]


def _set(args: list[str], option: str, value: str | None = None) -> list[str]:
    """The option's value replaced, or the option added (with the value, if one)."""
    if option in args:
        args = list(args)
        if value is not None:
            args[args.index(option) + 1] = value
        return args
    return [*args, option] if value is None else [*args, option, value]


def _argv(command: list[str], **options: str | None) -> list[str]:
    """The command with the options set, run by this environment's sb3-safe (option names: ``_`` for ``-``)."""
    program, *args = command
    assert program == "sb3-safe"
    for name, value in options.items():
        args = _set(args, ("-" if name in ("n", "f") else "--") + name.replace("_", "-"), value)
    return [SB3_SAFE, *args]


def _option(command: list[str], option: str) -> str:
    return command[command.index(option) + 1]


def test_two_workers_fill_one_study_then_train_a_trial(postgres_url: str, tmp_path: Path) -> None:
    """The guide's commands: two -optimize workers at once add two trials each to one study; --trial-id trains one."""
    optimize, train_trial = guide_commands()
    study_name = _option(optimize, "--study-name")
    assert _option(train_trial, "--study-name") == study_name
    with psycopg.connect(postgres_url) as connection:
        assert connection.execute("SHOW listen_addresses").fetchone() == ("127.0.0.1",)
    # The study with small trials waiting: each worker's trials take them in turn, whatever the sampler
    study = optuna.create_study(storage=postgres_url, study_name=study_name, direction="maximize")
    for _ in range(N_WORKERS * TRIALS_PER_WORKER):
        study.enqueue_trial(SMALL_TRIAL)

    # As on two machines: started together, each with its own log folder
    workers = []
    for worker in range(N_WORKERS):
        argv = _argv(
            optimize,
            storage=postgres_url,
            n_trials=str(TRIALS_PER_WORKER),
            n="256",
            sampler="random" if worker == 0 else "tpe",
            pruner="none",
            n_jobs="1",
            n_evaluations="1",
            eval_episodes="1",
            no_optim_plots=None,
            seed=str(worker),
            f=str(tmp_path / f"worker{worker}"),
        )
        # Output to files: a pipe read only after the other worker ended could fill up and block this one
        with open(tmp_path / f"worker{worker}.log", "w") as log:
            workers.append(subprocess.Popen(argv, env=ENV, stdout=log, stderr=subprocess.STDOUT))
    try:
        for process in workers:
            process.wait(timeout=TIMEOUT)
    finally:
        for process in workers:
            # Only one still running: after a timeout, which fails the test
            process.kill()
            process.wait()
    outputs = [(tmp_path / f"worker{worker}.log").read_text() for worker in range(N_WORKERS)]
    for process, output in zip(workers, outputs, strict=True):
        assert process.returncode == 0, output[-6000:]

    trials = optuna.load_study(storage=postgres_url, study_name=study_name).trials
    assert [trial.state for trial in trials] == [optuna.trial.TrialState.COMPLETE] * (N_WORKERS * TRIALS_PER_WORKER)
    # Optuna logs each trial a worker finished: every trial once, each worker its own two
    finished = [{int(n) for n in re.findall(r"Trial (\d+) finished with value", output)} for output in outputs]
    assert [len(numbers) for numbers in finished] == [TRIALS_PER_WORKER] * N_WORKERS, finished
    assert set.union(*finished) == {trial.number for trial in trials} == set(range(len(trials)))
    for trial in trials:
        assert {key: trial.params[key] for key in SMALL_TRIAL} == SMALL_TRIAL
        assert 0.003 <= trial.params["adaptive_kl_target"] <= 0.03
        assert 2.0 <= trial.params["logit_bound"] <= 20.0  # CartPole: discrete actions
        assert trial.value is not None and trial.value > 0

    # Trial 0 (which rl_zoo3 alone would skip): its values, not the configuration's (n_steps 32, 20 epochs ...)
    argv = _argv(
        train_trial, storage=postgres_url, trial_id="0", n="256", eval_freq="-1", no_report=None, f=str(tmp_path / "trial")
    )
    result = subprocess.run(argv, env=ENV, capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr[-6000:]
    params = trials[0].params
    model = KLAdaptivePPO.load(tmp_path / "trial" / "kl_ppo" / "CartPole-v1_1" / "CartPole-v1.zip", device="cpu")
    assert model.n_steps == 2 ** params["n_steps_pow"] and model.batch_size == 2 ** params["batch_size_pow"]
    assert model.n_epochs == params["n_epochs"]
    assert model.gamma == pytest.approx(1 - params["one_minus_gamma"])
    assert model.adaptive_kl_target == pytest.approx(params["adaptive_kl_target"])
    assert model.policy.logit_bound == pytest.approx(params["logit_bound"])


def test_workers_started_together_on_an_empty_database_all_open_it(postgres_url: str) -> None:
    """They all create optuna's tables at once: all but one fail (every time here without a retry) and try again."""
    n_workers = 3
    barrier, errors = threading.Barrier(n_workers), []

    def worker() -> None:
        barrier.wait()
        try:
            open_storage(postgres_url)
        except Exception as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=worker) for _ in range(n_workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=TIMEOUT)
    assert not errors
    assert optuna.get_all_study_names(postgres_url) == []


def test_unreachable_server_fails_in_one_line_with_the_password_masked(capsys: pytest.CaptureFixture) -> None:
    port = _free_port()  # nothing listens there
    storage = f"postgresql://kl:secret@127.0.0.1:{port}/optuna"
    args = ["train", "--algo", "kl_ppo", "--env", "CartPole-v1", "-optimize", "--storage", storage, "--study-name", "kl"]
    assert main(args) == EXIT_USAGE
    err = capsys.readouterr().err
    prefix = f"sb3-safe train: error: --storage postgresql://kl:***@127.0.0.1:{port}/optuna: cannot open the database: "
    assert err.startswith(prefix), err
    assert "Connection refused" in err and "secret" not in err
    assert len(err.splitlines()) == 1
