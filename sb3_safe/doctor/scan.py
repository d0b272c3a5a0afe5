"""
What a pickle would import and call when loaded, read from its opcodes without loading it (the approach of
picklescan and fickling).

:func:`scan_pickle` runs the pickle machine symbolically over ``pickletools.genops``: strings and globals are
tracked through the stack and the memo, so ``STACK_GLOBAL`` is resolved as the unpickler resolves it, and each
``REDUCE`` / ``NEWOBJ`` / ``OBJ`` / ``INST`` is known to call a named global (or something the pickle built, which
cannot be checked statically). Whether a global may be imported or called is :mod:`sb3_safe.doctor.allowlist`'s
decision. Nothing is imported, nothing is unpickled.
"""

import _compat_pickle
import math
import pickletools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Literal, Protocol

from sb3_safe.doctor.budget import BudgetExceeded, ReadingBudget

_STRING_OPCODES = frozenset(
    {"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8"}
)
_BYTES_OPCODES = frozenset({"BINBYTES", "SHORT_BINBYTES", "BINBYTES8"})
#: Opcodes that push an integer (kept: shapes and storage sizes are read from them)
_INT_OPCODES = frozenset({"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4"})
#: Opcodes that push a float, a bool or None: a plain value, not an object built by a call
_CONSTANT_OPCODES = frozenset({"FLOAT", "BINFLOAT", "NONE", "NEWTRUE", "NEWFALSE"})
#: Opcodes that build a container, filled by the mutating opcodes
_EMPTY_CONTAINER_OPCODES = frozenset({"EMPTY_LIST", "EMPTY_DICT", "EMPTY_SET"})
_MARKED_CONTAINER_OPCODES = frozenset({"LIST", "FROZENSET"})
_GET_OPCODES = frozenset({"GET", "BINGET", "LONG_BINGET"})
_PUT_OPCODES = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
#: Opcodes that call a method of the object below the mark / the value: append, extend, __setitem__, add
_MUTATING_OPCODES = {"APPEND": 2, "APPENDS": None, "SETITEM": 3, "SETITEMS": None, "ADDITEMS": None}
#: Attributes the unpickler looks up on an object and calls: ``__setstate__`` (BUILD), ``append`` / ``extend``
#: (APPEND(S) on what is not a list), ``add`` (ADDITEMS on what is not a set). BUILD's state sets attributes on the
#: object it builds, so a dict with such a key can make loading call any global the pickle names, allowed or not
_CALLED_ATTRIBUTES = frozenset({"__setstate__", "append", "extend", "add"})
#: The items of a function's state that say where it was defined
_FUNCTION_NAMES = ("__module__", "__qualname__")
#: numpy's reconstructor of arrays: numpy's pickles ask it for an empty array, then set the contents (BUILD)
_NUMPY_RECONSTRUCT = frozenset({"numpy._core.multiarray._reconstruct", "numpy.core.multiarray._reconstruct"})
#: Bytes per value of torch's legacy storage classes (a legacy torch file allocates a storage's declared size
#: before reading it); other classes are charged the largest
_STORAGE_ITEM_BYTES = {"DoubleStorage": 8, "FloatStorage": 4, "HalfStorage": 2, "BFloat16Storage": 2, "LongStorage": 8}
_LARGEST_ITEM_BYTES = 16
#: Opcodes charged to the budget at a time
_OPCODE_BATCH = 4096

#: How a pickle's persistent ids are resolved: refused (a full unpickler has no table for them), or as torch's
#: loaders resolve them (storages: a record of a torch zip, or data following a legacy torch file's pickles)
PersistentIds = Literal["refuse", "torch zip", "torch legacy"]


def python3_global(module: str, name: str, protocol: int) -> "PickleGlobal":
    """The global a pickle names, with Python 2's names mapped to Python 3's below protocol 3, as the unpickler maps them."""
    if protocol < 3:
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
    return PickleGlobal(module, name)


def printable(text: str) -> str:
    """``text`` with control characters escaped: names from a file must not move the terminal's cursor or add lines."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


@dataclass(frozen=True)
class PickleGlobal:
    """
    A global a pickle names (``GLOBAL``, ``STACK_GLOBAL``, ``INST``): loading imports ``module`` and looks ``name`` up.

    :param module: the module the unpickler imports
    :param name: the attribute it looks up there (dots: an attribute path)
    """

    module: str
    name: str

    def __str__(self) -> str:
        return f"{self.module}.{self.name}"


class ScanRules(Protocol):
    """What a pickle may do with a global (:class:`sb3_safe.doctor.allowlist.Allowlist`)."""

    def may_reference(self, found: PickleGlobal) -> bool:
        """Whether loading may import and look up ``found`` (to hold it)."""

    def may_call(self, found: PickleGlobal) -> bool:
        """Whether loading may call ``found``."""

    def may_pass(self, callee: PickleGlobal, passed: PickleGlobal) -> bool:
        """Whether ``callee`` may be given ``passed`` as an argument (it may call it)."""

    def loads_bytes(self, found: PickleGlobal) -> bool:
        """Whether calling ``found`` loads its bytes argument as a torch file."""

    def describe(self, found: PickleGlobal) -> str | None:
        """What loading does with ``found``, where that says more than "the pickle calls it"; None otherwise."""

    def may_initialize(self, found: PickleGlobal) -> bool:
        """Whether loading may call ``found`` with arguments (REDUCE), not only build it without ``__init__`` (NEWOBJ)."""


@dataclass(frozen=True)
class Finding:
    """
    Something a pickle would do on loading that an SB3 model file never needs.

    :param entry: where the pickle is, e.g. ``data["policy_class"]`` or ``policy.pth``
    :param target: what would run: ``module.name``, or a description when it has no static name
    :param detail: how: the pickle calls it, imports it, ...
    :param builds_code: whether the global builds a function from code stored in the file (cloudpickle)
    """

    entry: str
    target: str
    detail: str
    builds_code: bool = False

    def __post_init__(self) -> None:
        # The names come from the file
        for name in ("entry", "target", "detail"):
            object.__setattr__(self, name, printable(getattr(self, name)))

    def __str__(self) -> str:
        return f"{self.entry}: loading this file would run code from {self.target} ({self.detail})"


@dataclass
class PickleScan:
    """
    What :func:`scan_pickle` read from one pickle.

    :param entry: where the pickle is
    :param references: every global it names, in order of appearance (repeats removed)
    :param calls: the globals it calls (to build objects), in order (repeats removed)
    :param findings: what it would do that an SB3 file never needs
    :param nested: pickles carried inside it as bytes and loaded by a call (``torch.storage._load_from_bytes``),
        as (entry, bytes): to be scanned as torch files too
    :param error: why the opcodes stop being a valid pickle, if they do (the unpickler stops there too)
    :param function_names: the first ``__module__`` and ``__qualname__`` items of the pickle's dicts: where a
        function stored with its code says it was defined (cloudpickle's state of the function), as the file says
    """

    entry: str
    references: list[PickleGlobal] = field(default_factory=list)
    calls: list[PickleGlobal] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    nested: list[tuple[str, bytes]] = field(default_factory=list)
    error: str | None = None
    function_names: dict[str, str] = field(default_factory=dict)


class _Mark:
    """The unpickler's mark."""


class _Built:
    """
    An object the pickle built by a call or as a container: calling it is not statically checkable.

    :param items: what the pickle puts in it: a container's items (keys and values of a dict), BUILD's state
    :param arguments: the arguments of the call that built it: the object may hold them (a ``deque`` holds its list's
        items), but a global among them was checked as an argument of that call
    """

    __slots__ = ("arguments", "items")

    def __init__(self, items: list[Any] | None = None, arguments: tuple[Any, ...] = ()) -> None:
        self.items: list[Any] = [] if items is None else items
        self.arguments = arguments


class _Constant:
    """A number, a bool or None."""


_MARK = _Mark()
_CONSTANT = _Constant()


class _MalformedPickle(Exception):
    """The opcodes are not a valid pickle from here on; the unpickler would raise here too."""


class _Machine:
    """The pickle machine's stack and memo, with only what the scan needs: strings, bytes, tuples, globals."""

    def __init__(self, scan: PickleScan, rules: ScanRules, budget: ReadingBudget, persistent_ids: PersistentIds):
        self.scan = scan
        self.rules = rules
        self.budget = budget
        self.persistent_ids = persistent_ids
        #: the legacy storages declared so far, by key: loading allocates each once
        self.storages: set[Any] = set()
        self.stack: list[Any] = []
        self.memo: dict[int, Any] = {}
        #: the PROTO opcode's protocol: below 3 the unpickler maps Python 2 names (``__builtin__``) to Python 3's
        self.protocol = 0

    def pop(self) -> Any:
        if not self.stack:
            raise _MalformedPickle("stack underflow")
        return self.stack.pop()

    def pop_to_mark(self) -> list[Any]:
        items: list[Any] = []
        while True:
            item = self.pop()
            if item is _MARK:
                return items[::-1]
            items.append(item)

    def top(self) -> Any:
        if not self.stack:
            raise _MalformedPickle("stack underflow")
        return self.stack[-1]

    def name_global(self, module: Any, name: Any) -> Any:
        if not (isinstance(module, str) and isinstance(name, str)):
            # The unpickler requires both to be str: it raises, unless computed at load time by a call
            built = isinstance(module, _Built) or isinstance(name, _Built)
            what = "module and name" if built else "a module or name that is not a string"
            self.flag("a STACK_GLOBAL that cannot be resolved statically", f"{what} computed while loading")
            return _Built()
        found = python3_global(module, name, self.protocol)
        if found not in self.scan.references:
            self.scan.references.append(found)
        return found

    def call(self, callee: Any, arguments: tuple[Any, ...], initializes: bool) -> _Built:
        """
        A call of ``callee`` with ``arguments`` (as the unpickler checks them: REDUCE's and OBJ's argument tuple;
        NEWOBJ_EX's tuple and dict); ``initializes`` for a call that runs the callee, not only its ``__new__``.
        """
        self.budget.charge_call(self.scan.entry)
        result = _Built(arguments=arguments)
        if not isinstance(callee, PickleGlobal):
            self.flag(_BUILT_CALL, "not a named global, cannot be checked statically")
            return result
        if callee not in self.scan.calls:
            self.scan.calls.append(callee)
        for passed in _globals_in(arguments, self.budget, self.scan.entry):
            if not self.rules.may_pass(callee, passed):
                self.flag(str(passed), f"the pickle passes it to {callee}, which calls it")
        if initializes and self.rules.may_call(callee) and not self.rules.may_initialize(callee):
            self.flag(str(callee), _INITIALIZES)
        args = arguments[0]
        if self.rules.loads_bytes(callee):
            if isinstance(args, tuple) and len(args) == 1 and isinstance(args[0], bytes):
                self.scan.nested.append((f"{self.scan.entry} > bytes loaded by {callee}", args[0]))
            else:
                self.flag(f"{callee} of data computed while loading", "cannot be checked statically")
        elif str(callee) in _NUMPY_RECONSTRUCT:
            problem = empty_shape_problem(args[1] if isinstance(args, tuple) and len(args) > 1 else None)
            if problem is not None:
                self.flag(f"{callee} {problem}", _NUMPY_ALLOCATES)
        return result

    def persistent_id(self, pid: Any) -> None:
        """A persistent id: refused, or a storage, whose size a legacy torch file allocates before reading it."""
        if self.persistent_ids == "refuse":
            raise _MalformedPickle("a persistent id, which the unpickler that loads this pickle has no table to resolve")
        if self.persistent_ids != "torch legacy":
            return  # a record of the torch zip, already charged at its declared size
        # ("storage", storage class, key, location, size, view metadata)
        if not (isinstance(pid, tuple) and len(pid) in (5, 6) and pid[0] == "storage" and isinstance(pid[4], int)):
            raise _MalformedPickle("a persistent id that is not one of a torch storage")
        storage_type, key, numel = pid[1], pid[2], pid[4]
        if isinstance(key, _Built) or key in self.storages:
            return
        self.storages.add(key)
        type_name = storage_type.name if isinstance(storage_type, PickleGlobal) else None
        item_bytes = _STORAGE_ITEM_BYTES.get(type_name, _LARGEST_ITEM_BYTES) if type_name else _LARGEST_ITEM_BYTES
        self.budget.charge_bytes(max(numel, 0) * item_bytes, self.scan.entry)

    def mutate(self, target: Any, added: list[Any]) -> None:
        if isinstance(target, PickleGlobal):
            # APPEND / SETITEM / BUILD on a class or function: its methods run, its attributes change
            self.flag(str(target), "the pickle changes it (appends to it, sets items or attributes)")
        elif isinstance(target, _Built):
            target.items += added

    def read_items(self, items: list[Any]) -> None:
        """Check the keys of a dict's items; keep the names a stored function gives itself."""
        self.check_keys(items[0::2])
        for key, value in zip(items[0::2], items[1::2], strict=False):
            if key in _FUNCTION_NAMES and isinstance(value, str):
                self.scan.function_names.setdefault(key, printable(value))

    def check_keys(self, keys: list[Any]) -> None:
        """Flag dict keys that can set an attribute the unpickler calls (through BUILD's state)."""
        for key in keys:
            if isinstance(key, str) and (key in _CALLED_ATTRIBUTES or (key.startswith("__") and key.endswith("__"))):
                self.flag(f"attribute {key}", _ATTRIBUTE_KEY)
            elif isinstance(key, _Built):  # a str subclass built by a call names attributes as a str does
                self.flag(_COMPUTED_KEY, "cannot be checked statically (it can name an attribute)")

    def global_findings(self) -> list[Finding]:
        """The globals loading may not import, or may import but not call (in order of appearance)."""
        findings = []
        for found in self.scan.references:
            called = found in self.scan.calls
            described = self.rules.describe(found)
            if not self.rules.may_reference(found):
                detail = described or ("the pickle calls it" if called else "the pickle imports it, for SB3 to call")
            elif called and not self.rules.may_call(found):
                # A class SB3 files name (policy_class, activation_fn, ...) but never build while loading
                detail = "the pickle calls it"
            else:
                continue
            findings.append(Finding(self.scan.entry, str(found), detail, builds_code=described is not None))
        return findings

    def flag(self, target: str, detail: str) -> None:
        finding = Finding(self.scan.entry, target, detail)
        if finding not in self.scan.findings:
            self.scan.findings.append(finding)

    def step(self, opcode: pickletools.OpcodeInfo, arg: Any) -> None:
        name = opcode.name
        if name in _STRING_OPCODES or name in _BYTES_OPCODES or name in _INT_OPCODES:
            self.stack.append(arg)
        elif name in _CONSTANT_OPCODES:
            self.stack.append(_CONSTANT)
        elif name in ("GLOBAL", "INST"):
            module, _, attribute = str(arg).partition(" ")
            found = self.name_global(module, attribute)
            if name == "INST":
                self.stack.append(self.call(found, (tuple(self.pop_to_mark()),), initializes=True))
            else:
                self.stack.append(found)
        elif name == "STACK_GLOBAL":
            attribute = self.pop()
            self.stack.append(self.name_global(self.pop(), attribute))
        elif name == "REDUCE" or name == "NEWOBJ":
            args = self.pop()
            self.stack.append(self.call(self.pop(), (args,), initializes=name == "REDUCE"))
        elif name == "NEWOBJ_EX":
            kwargs = self.pop()
            args = self.pop()
            self.stack.append(self.call(self.pop(), (args, kwargs), initializes=False))
        elif name == "OBJ":
            items = self.pop_to_mark()
            if not items:
                raise _MalformedPickle("OBJ without a class")
            self.stack.append(self.call(items[0], (tuple(items[1:]),), initializes=True))
        elif name == "BUILD":
            state = self.pop()
            self.mutate(self.top(), [state])
        elif name in _MUTATING_OPCODES:
            depth = _MUTATING_OPCODES[name]
            items = self.pop_to_mark() if depth is None else [self.pop() for _ in range(depth - 1)][::-1]
            if name.startswith("SETITEM"):
                self.read_items(items)
            self.mutate(self.top(), items)
        elif name == "DICT":
            items = self.pop_to_mark()
            self.read_items(items)
            self.stack.append(_Built(items))
        elif name in _MARKED_CONTAINER_OPCODES:
            self.stack.append(_Built(self.pop_to_mark()))
        elif name in _EMPTY_CONTAINER_OPCODES:
            self.stack.append(_Built())
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            items = [self.pop() for _ in range(int(name[-1]))]
            self.stack.append(tuple(items[::-1]))
        elif name == "TUPLE":
            self.stack.append(tuple(self.pop_to_mark()))
        elif name == "EMPTY_TUPLE":
            self.stack.append(())
        elif name == "MEMOIZE":
            self.memo[len(self.memo)] = self.top()
        elif name in _PUT_OPCODES:
            self.memo[int(arg)] = self.top()
        elif name in _GET_OPCODES:
            if int(arg) not in self.memo:
                raise _MalformedPickle(f"memo key {arg} was never stored")
            self.stack.append(self.memo[int(arg)])
        elif name == "DUP":
            self.stack.append(self.top())
        elif name in ("EXT1", "EXT2", "EXT4"):
            # copyreg's extension registry maps the code to a global only the loading process knows
            self.flag(f"extension code {arg} (copyreg registry)", "a global that cannot be resolved statically")
            self.stack.append(_Built())
        elif name in ("PERSID", "BINPERSID"):
            self.persistent_id(arg if name == "PERSID" else self.pop())
            self.stack.append(_Built())
        elif name == "MARK":
            self.stack.append(_MARK)
        elif name == "PROTO":
            self.protocol = int(arg)
        else:
            self._generic(opcode)

    def _generic(self, opcode: pickletools.OpcodeInfo) -> None:
        before = opcode.stack_before
        if pickletools.markobject in before:
            self.pop_to_mark()
            for _ in range(before.index(pickletools.markobject)):
                self.pop()
        else:
            for _ in before:
                self.pop()
        self.stack.extend(_MARK if item is pickletools.markobject else _Built() for item in opcode.stack_after)


def _globals_in(arguments: tuple[Any, ...], budget: ReadingBudget, entry: str) -> Iterator[PickleGlobal]:
    """
    The globals in a call's arguments, inside tuples and containers too (without recursion: a pickle can nest them
    deeply). Each object is searched once per call (the memo can share one list among many), and every value
    searched is charged to the budget: at least what the unpickler's search of the same call searches, since an
    object built by an earlier call is searched through that call's arguments too (only for the cost: the globals
    among them were checked as that call's).
    """
    budget.charge_values(1, entry)
    pending: list[Any] = [arguments]
    searched: set[int] = set()
    # What earlier calls' arguments hold: searched for the cost only
    for_cost: list[Any] = []
    searched_for_cost: set[int] = set()
    while pending:
        item = pending.pop()
        if isinstance(item, PickleGlobal):
            yield item
        elif isinstance(item, tuple | _Built) and id(item) not in searched:
            searched.add(id(item))
            pending.extend(_held(item, budget, entry, for_cost))
    while for_cost:
        item = for_cost.pop()
        if isinstance(item, tuple | _Built) and id(item) not in searched_for_cost:
            searched_for_cost.add(id(item))
            for_cost.extend(_held(item, budget, entry, for_cost))


def _held(item: tuple[Any, ...] | _Built, budget: ReadingBudget, entry: str, for_cost: list[Any]) -> Sequence[Any]:
    """What a tuple or a built object holds, charged; a built object's call arguments go to ``for_cost``."""
    if isinstance(item, tuple):
        budget.charge_values(len(item), entry)
        return item
    budget.charge_values(len(item.items) + len(item.arguments), entry)
    for_cost.extend(item.arguments)
    return item.items


def empty_shape_problem(shape: Any) -> str | None:
    """Why numpy's reconstructor of arrays must not be given ``shape``: its pickles ask for no values; None if fine."""
    if not (isinstance(shape, tuple) and all(isinstance(size, int) for size in shape)):
        return "asked for an array of a shape computed while loading"
    values = math.prod(shape)
    return None if values == 0 else f"asked for an array of {values} values before its contents are read"


def scan_pickle(
    data: bytes | IO[bytes],
    entry: str,
    rules: ScanRules,
    budget: ReadingBudget | None = None,
    persistent_ids: PersistentIds = "refuse",
) -> PickleScan:
    """
    Read the globals a pickle would import and call, without loading it.

    :param data: the pickle, or a binary file positioned at its start (left just after its ``STOP``: torch's
        legacy format is several pickles in a row); what follows ``STOP`` is ignored, as the unpickler ignores it
    :param entry: where it is, for the findings (``data["policy_class"]``, ``policy.pth``)
    :param rules: what loading may do with each global
    :param budget: the budget of the file the pickle is in, charged with its opcodes, calls and the values of their
        arguments (the legacy storages it declares too); None: a budget of its own, with the default limits
    :param persistent_ids: how loading resolves its persistent ids: refused by a full unpickler, storages for torch
    :return: what it names, calls, and would do beyond an SB3 file's needs; ``error`` says where it stops being
        a pickle (what comes before still runs when loaded, so its findings stand)
    :raises BudgetExceeded: when the pickle costs more than is left of the budget
    """
    budget = budget or ReadingBudget()
    scan = PickleScan(entry)
    machine = _Machine(scan, rules, budget, persistent_ids)
    stopped = False
    counted = 0
    try:
        for count, (opcode, arg, position) in enumerate(pickletools.genops(data), start=1):
            if count - counted == _OPCODE_BATCH:
                budget.charge_opcodes(count - counted, entry)
                counted = count
            try:
                machine.step(opcode, arg)
            except _MalformedPickle as error:
                raise _MalformedPickle(f"{error} at byte {position} ({opcode.name})") from None
            if opcode.name == "STOP":
                stopped = True
                budget.charge_opcodes(count - counted, entry)
    except BudgetExceeded:
        raise
    except _MalformedPickle as error:
        scan.error = str(error)
    except Exception as error:  # pickletools reports truncated or unknown opcodes as ValueError, others are rarer
        message = str(error).strip()
        scan.error = message.splitlines()[0] if message else type(error).__name__
    else:
        if not stopped:
            scan.error = "the pickle ends without STOP"
    scan.findings[:0] = machine.global_findings()
    scan.findings = _merge_code_findings(scan.findings)
    return scan


_BUILT_CALL = "an object the pickle builds and then calls"
_INITIALIZES = "the pickle calls it with arguments; pickles of its objects build them without calling it (NEWOBJ)"
_NUMPY_ALLOCATES = "loading allocates what the file asks for, which numpy's pickles never ask"
_ATTRIBUTE_KEY = "a dict key BUILD's state can set on an object, which the unpickler may call"
_COMPUTED_KEY = "a dict key computed while loading"


def _merge_code_findings(findings: list[Finding]) -> list[Finding]:
    """
    One finding for a function pickled by value (cloudpickle's machinery names several globals and calls what it
    builds), with the findings that name anything else.
    """
    code = [finding for finding in findings if finding.builds_code]
    if not code:
        return findings
    # cloudpickle's globals, and the attributes of the function it builds (__globals__, __qualname__, ...)
    machinery = {
        finding.target for finding in findings if finding.target.startswith("cloudpickle.") or finding.detail == _ATTRIBUTE_KEY
    } | {_BUILT_CALL, _COMPUTED_KEY}
    return [code[0]] + [finding for finding in findings if finding not in code and finding.target not in machinery]
