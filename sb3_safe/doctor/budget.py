"""
One budget per file read as untrusted input: what reading it may cost, charged across every archive nested in it,
every pickle, every tensor and every call, so that a small file cannot make ``sb3-safe doctor`` or
``sb3_safe.load`` hold gigabytes or work for minutes by repeating a cheap request (a deflated record loaded eight
times, a shared list handed to forty calls).

Both read a file with the same functions, each charging one :class:`ReadingBudget`; the first charge beyond a limit
stops the reading with :class:`BudgetExceeded`, one line naming the budget, the entry and the option that raises it.
"""

from dataclasses import dataclass

MIB = 2**20
#: Default limit on one entry's uncompressed size. Real SB3 models are far below it (measured, SB3 2.9): PPO's
#: CnnPolicy on Atari's 84x84x4 frames (1.7M parameters) saves 6.4 MiB in policy.pth and 12.9 MiB of Adam moments
#: in policy.optimizer.pth, DQN's 12.9 MiB each; on raw 210x160x3 frames (11.6M parameters) 44.3 and 88.6 MiB.
#: 512 MiB holds the Adam state of a 64M-parameter policy: 40 times the Atari model, 6 times the raw-frame one.
DEFAULT_MAX_ENTRY_BYTES = 512 * MIB
#: Default limit on the bytes a file makes its reader hold: the uncompressed sizes of every archive's entries
#: (the model zip's, and the records of each torch file inside it, which become the tensors), the pickles decoded
#: from ``data``. The raw-frame model above charges 266 MiB (its entries, then its tensors' records), the Atari
#: model 39 MiB: 3.8 and 26 times below
DEFAULT_MAX_TOTAL_BYTES = 1024 * MIB
#: Default limit on the values searched for globals in calls' arguments, over the file (each call's shared objects
#: once). Real files search a few thousand (PPO's CnnPolicy on raw frames: 1,221; a replay buffer's ``deque`` of
#: episode infos: 700); 500k take about 2 s to search on a loaded 2-core machine
DEFAULT_MAX_VALUES = 500_000
#: Default limit on the calls the file's pickles make to build objects. Real files make a few hundred (a model's
#: ``data``: its spaces' arrays and dtypes; a replay buffer: one per array)
DEFAULT_MAX_CALLS = 100_000
#: Default limit on the opcodes of all the file's pickles. A real model's pickles have a few thousand (a state dict
#: of 100 tensors: about 2,000)
DEFAULT_MAX_OPCODES = 2_000_000


class UnreadableModelError(Exception):
    """The file is not a readable SB3 model; the message says why, in one line."""


class BudgetExceeded(UnreadableModelError):
    """Reading the file would cost more than its :class:`SizeLimits`; the message names the limit and the entry."""


@dataclass(frozen=True)
class SizeLimits:
    """
    How much reading one file may cost, in all (doctor's ``--max-*`` options).

    :param entry: most bytes of one entry, uncompressed (also of one record of a torch file inside it)
    :param total: most bytes held for the whole file: every archive's entries uncompressed, nested ones included,
        and the pickles decoded from ``data``
    :param values: most values searched for globals in the arguments of the file's calls
    :param calls: most calls the file's pickles make
    :param opcodes: most opcodes of all the file's pickles
    """

    entry: int = DEFAULT_MAX_ENTRY_BYTES
    total: int = DEFAULT_MAX_TOTAL_BYTES
    values: int = DEFAULT_MAX_VALUES
    calls: int = DEFAULT_MAX_CALLS
    opcodes: int = DEFAULT_MAX_OPCODES


def size_text(size: int) -> str:
    """
    A size in KiB, MiB or GiB.

    :param size: bytes
    """
    if size < MIB:
        return f"{size / 2**10:.1f} KiB"
    return f"{size / MIB:.1f} MiB" if size < 10 * 2**30 else f"{size / 2**30:.1f} GiB"


class ReadingBudget:
    """
    What reading one file has cost so far, against its :class:`SizeLimits`.

    :param limits: the limits of the file
    """

    def __init__(self, limits: SizeLimits | None = None) -> None:
        self.limits = limits or SizeLimits()
        self.bytes = 0
        self.values = 0
        self.calls = 0
        self.opcodes = 0

    def charge_bytes(self, size: int, entry: str) -> None:
        """
        Charge ``size`` bytes held for ``entry``.

        :param size: bytes
        :param entry: what holds them, for the message
        :raises BudgetExceeded: beyond ``limits.total`` in all
        """
        self.bytes += size
        if self.bytes > self.limits.total:
            raise BudgetExceeded(
                f"{entry}: reading the file would hold more than its budget of {size_text(self.limits.total)} "
                f"(entries, records and pickles together; --max-total-mb raises it)"
            )

    def charge_values(self, count: int, entry: str) -> None:
        """
        Charge ``count`` values searched in a call's arguments in ``entry``.

        :param count: values
        :param entry: the pickle's entry, for the message
        :raises BudgetExceeded: beyond ``limits.values`` in all
        """
        self.values += count
        if self.values > self.limits.values:
            raise BudgetExceeded(
                f"{entry}: its calls' arguments hold more than the file's budget of {self.limits.values} values to "
                "check (--max-values raises it)"
            )

    def charge_call(self, entry: str) -> None:
        """
        Charge one call made by a pickle of ``entry``.

        :param entry: the pickle's entry, for the message
        :raises BudgetExceeded: beyond ``limits.calls`` in all
        """
        self.calls += 1
        if self.calls > self.limits.calls:
            raise BudgetExceeded(
                f"{entry}: the file's pickles make more than its budget of {self.limits.calls} calls (--max-calls raises it)"
            )

    def charge_opcodes(self, count: int, entry: str) -> None:
        """
        Charge ``count`` opcodes read from a pickle of ``entry``.

        :param count: opcodes
        :param entry: the pickle's entry, for the message
        :raises BudgetExceeded: beyond ``limits.opcodes`` in all
        """
        self.opcodes += count
        if self.opcodes > self.limits.opcodes:
            raise BudgetExceeded(
                f"{entry}: the file's pickles have more than its budget of {self.limits.opcodes} opcodes "
                "(--max-opcodes raises it)"
            )
