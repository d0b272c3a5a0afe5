"""
One budget per untrusted file, and one verdict: small files that made ``sb3_safe.load`` hold gigabytes or work for
a minute (while doctor called them healthy) are refused by both, for the same cause, at a bounded cost; shared
(memoized) objects are searched once per call; a persistent id is refused by both.
"""

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from stable_baselines3 import PPO

import sb3_safe
from sb3_safe.cli import main
from sb3_safe.doctor import EXIT_HEALTHY, EXIT_UNREADABLE, SizeLimits
from sb3_safe.doctor.allowlist import Allowlist
from sb3_safe.doctor.budget import BudgetExceeded, ReadingBudget
from sb3_safe.doctor.reading import read_model
from sb3_safe.doctor.scan import scan_pickle
from tests.zip_builders import (
    MEMOIZE,
    POP,
    PROTO_4,
    REDUCE,
    STACK_GLOBAL,
    STOP,
    TUPLE1,
    binget,
    rewrite_zip,
    serialized,
    torch_zip_of_zeros,
    unicode,
)

_EMPTY_LIST, _MARK, _APPENDS, _NONE = b"]", b"(", b"e", b"N"


@pytest.fixture(scope="module")
def model_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "model.zip"
    PPO("MlpPolicy", "CartPole-v1", n_steps=16, batch_size=16, n_epochs=1).save(path)
    return path


def _long_binget(index: int) -> bytes:
    return b"j" + index.to_bytes(4, "little")


def _binbytes(raw: bytes) -> bytes:
    return b"B" + len(raw).to_bytes(4, "little") + raw


def _calls(module: str, name: str, argument: bytes, count: int) -> bytes:
    """
    A pickle that memoizes ``module.name`` (memo 0) and ``argument`` (after the objects it memoizes, from memo 1 on),
    then calls it ``count`` times.
    """
    pickled = PROTO_4 + unicode(module) + unicode(name) + STACK_GLOBAL + MEMOIZE + argument + MEMOIZE + POP
    pickled += (binget(0) + binget(1 + argument.count(MEMOIZE)) + TUPLE1 + REDUCE + POP) * count
    return pickled + _NONE + STOP


def _with_item(model_zip: Path, target: Path, pickled: bytes) -> Path:
    # An item SB3 sets as an attribute and never uses: the file loads if its reading does
    return rewrite_zip(model_zip, target, data=lambda data: data | {"_hostile": serialized(pickled)})


_PEAK_SCRIPT = """
import json, resource, sys, time
import sb3_safe
from stable_baselines3 import PPO
from sb3_safe.cli import main

def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

baseline, start = peak(), time.perf_counter()
status = main(["doctor", sys.argv[1]])
try:
    sb3_safe.load(PPO, sys.argv[1])
    loaded = "loaded"
except sb3_safe.RefusedFileError as error:
    loaded = str(error)
print(json.dumps({"doctor": status, "load": loaded, "grew": peak() - baseline, "seconds": time.perf_counter() - start}))
"""


def _doctor_and_load(path: Path) -> tuple[dict, str]:
    """Doctor's status and sb3_safe.load's outcome in a fresh process, with its memory growth and time."""
    result = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT, str(path)], capture_output=True, text=True, timeout=300)
    assert "Traceback" not in result.stderr, result.stderr
    return json.loads(result.stdout.splitlines()[-1]), result.stderr


@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss is in KiB on Linux")
def test_a_deflated_record_loaded_many_times_is_charged_each_time(model_zip: Path, tmp_path: Path) -> None:
    """
    Finding: a 43 KB file whose data item loads a torch zip (a 500 MiB record deflated to 0.5 MiB) through the
    allowlisted torch.storage._load_from_bytes 8 times made sb3_safe.load allocate 4.24 GiB, and doctor said
    "Healthy". Each load is charged to the file's one budget: both refuse it at the third, naming the budget.
    """
    nested = b"".join(segment for segment in torch_zip_of_zeros(500 * 2**20 // 4, deflate_record=True))  # type: ignore[misc]
    pickled = _calls("torch.storage", "_load_from_bytes", _binbytes(nested), count=8)
    path = _with_item(model_zip, tmp_path / "loads.zip", pickled)
    assert path.stat().st_size < 2e6
    measured, err = _doctor_and_load(path)
    assert measured["doctor"] == EXIT_UNREADABLE
    cause = "reading the file would hold more than its budget of 1024.0 MiB"
    assert cause in err and cause in measured["load"]
    assert 'data["_hostile"] > bytes loaded by torch.storage._load_from_bytes' in measured["load"]
    assert measured["grew"] < 256 * 2**20, f"peak memory grew by {measured['grew'] / 2**20:.0f} MiB"


def test_a_shared_list_handed_to_many_calls_is_searched_once_per_call(model_zip: Path, tmp_path: Path) -> None:
    """
    Finding: one memoized list of lists (990k leaves) handed to the allowlisted collections.deque 40 times kept
    sb3_safe.load busy for 58 s (its search had no visited set), while doctor's walk never entered lists. Both now
    search each shared object once per call: 40 calls cost 40 x 2k values, and the file loads.
    """
    inner = _EMPTY_LIST + MEMOIZE + _MARK + _NONE * 1000 + _APPENDS  # memo 1
    outer = _EMPTY_LIST + _MARK + inner + binget(1) * 989 + _APPENDS
    pickled = _calls("collections", "deque", outer, count=40)
    budget = ReadingBudget()
    scan = scan_pickle(pickled, "data", Allowlist(), budget)
    assert scan.findings == [] and scan.error is None
    assert budget.calls == 40 and budget.values < 100_000
    path = _with_item(model_zip, tmp_path / "shared.zip", pickled)
    measured, _ = _doctor_and_load(path)
    assert measured == measured | {"doctor": EXIT_HEALTHY, "load": "loaded"}


def test_a_long_list_handed_to_many_calls_passes_the_budget_of_values(model_zip: Path, tmp_path: Path) -> None:
    """
    A list of 300k references to one object, handed to 8 calls: each call's search pushes 300k values, 2.4M in all,
    for 0.6 MB of pickle (each further call costs 5 bytes). Both refuse the file when the search passes the budget
    of values.
    """
    flat = _EMPTY_LIST + _MARK + _NONE + MEMOIZE + _long_binget(1) * 299_999 + _APPENDS
    pickled = _calls("collections", "deque", flat, count=8)
    with pytest.raises(BudgetExceeded, match="more than the file's budget of 500000 values"):
        scan_pickle(pickled, "data", Allowlist(), ReadingBudget())
    path = _with_item(model_zip, tmp_path / "flat.zip", pickled)
    assert main(["doctor", str(path)]) == EXIT_UNREADABLE
    with pytest.raises(sb3_safe.RefusedFileError, match="more than the file's budget of 500000 values"):
        sb3_safe.load(PPO, path)
    # The caller's limits raise the budget: then it loads
    sb3_safe.load(PPO, path, limits=SizeLimits(values=3_000_000))


def test_many_calls_pass_the_budget_of_calls(model_zip: Path, tmp_path: Path) -> None:
    pickled = _calls("builtins", "set", b")", count=200)  # set(()) 200 times
    path = _with_item(model_zip, tmp_path / "calls.zip", pickled)
    limits = SizeLimits(calls=100)
    with pytest.raises(sb3_safe.RefusedFileError, match="more than its budget of 100 calls"):
        sb3_safe.load(PPO, path, limits=limits)
    sb3_safe.load(PPO, path)


def test_a_persistent_id_in_data_is_refused_by_both(model_zip: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """
    Finding: a data pickle with a persistent id (BINPERSID): sb3_safe.load refused it, doctor said "Healthy". A full
    unpickler has no table for persistent ids (cloudpickle.loads fails there): both refuse, naming it.
    """
    pickled = PROTO_4 + unicode("0") + b"Q" + STOP  # BINPERSID
    path = _with_item(model_zip, tmp_path / "persistent.zip", pickled)
    assert main(["doctor", str(path)]) == EXIT_UNREADABLE
    err = capsys.readouterr().err
    cause = "a persistent id, which the unpickler that loads this pickle has no table to resolve"
    assert cause in err
    with pytest.raises(sb3_safe.RefusedFileError) as refused:
        sb3_safe.load(PPO, path)
    assert cause in str(refused.value)


def test_a_torch_file_inside_is_charged_to_the_file(model_zip: Path, tmp_path: Path) -> None:
    """The records of the torch files in a model are charged to the file's budget with its own entries."""
    with_records = ReadingBudget()
    with model_zip.open("rb") as file:
        read_model(file, "model.zip", Allowlist(), with_records)
    with zipfile.ZipFile(model_zip) as archive:
        outer = sum(info.file_size for info in archive.infolist())
    assert with_records.bytes > outer  # plus the records of policy.pth and policy.optimizer.pth
