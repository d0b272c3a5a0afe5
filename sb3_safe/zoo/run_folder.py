"""
The files of an rl-zoo run folder read as data, not run as code.

rl_zoo3 reads a run's ``config.yml`` and ``args.yml`` with YAML's unsafe loader (a ``!!python/object/apply`` tag
calls anything) and evaluates the ``normalize`` field with ``eval``; its ``env_wrapper`` / ``vec_env_wrapper``
fields name classes it imports and calls. Here the YAML loader builds only what rl_zoo3 writes (plain values, its
``OrderedDict`` and tuples, and classes of the SB3 family as in ``policy_kwargs``), a document whose aliases
expand beyond :data:`MAX_YAML_NODES` is refused, ``normalize`` is parsed as a literal (``dict(...)`` with literal
keyword arguments included) and the wrappers must be ``gym.Wrapper`` / ``VecEnvWrapper`` classes of the SB3 family
or of a trusted module. :func:`run_folder_reading` makes rl_zoo3's ``enjoy`` read run folders so.

``obs_rms.pkl`` is only tested for existence by rl_zoo3; ``vecnormalize.pkl`` and the model are unpickled, and are
read through :func:`sb3_safe.loading.secure_reading`.
"""

import ast
import contextlib
import functools
import importlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import gymnasium as gym
import rl_zoo3.enjoy
import yaml
from stable_baselines3.common.vec_env import VecEnvWrapper

from sb3_safe.zoo.errors import ZooUsageError, one_line

#: the largest ``config.yml`` / ``args.yml`` read, in bytes (rl-zoo writes a few KiB)
MAX_YAML_BYTES = 2**20
#: the most values a run folder's YAML document may hold with its aliases expanded ("billion laughs")
MAX_YAML_NODES = 100_000
#: the deepest nesting of a YAML document
MAX_YAML_DEPTH = 64
#: the longest ``normalize`` string parsed
MAX_LITERAL_CHARS = 10_000
#: packages whose classes a run folder may name: those of SB3 files and rl-zoo's configurations
TRUSTED_PACKAGES = ("gymnasium", "stable_baselines3", "sb3_contrib", "sb3_safe", "rl_zoo3", "torch.nn")
#: the fields whose classes rl_zoo3's ``enjoy`` imports and wraps the environment in, and the base they must have
WRAPPER_FIELDS: dict[str, type] = {"env_wrapper": gym.Wrapper, "vec_env_wrapper": VecEnvWrapper}

_TRUST_HINT = "--trust-folder reads a folder of your own as rl_zoo3 does"
_ORDERED_DICT_TAG = "tag:yaml.org,2002:python/object/apply:collections.OrderedDict"
_TUPLE_TAG = "tag:yaml.org,2002:python/tuple"
_NAME_PREFIX = "tag:yaml.org,2002:python/name:"


class RunFolderError(ZooUsageError):
    """A run folder's file that would run code, or that is not what rl-zoo writes; the message names file and field."""

    def __init__(self, path: str | Path, field: str | None, reason: str) -> None:
        where = f"{path}: {field}" if field else str(path)
        super().__init__(f"{where}: refused: {reason} ({_TRUST_HINT})")


def _in_packages(module: str, packages: Sequence[str]) -> bool:
    return any(module == package or module.startswith(f"{package}.") for package in packages)


class _RunFolderLoader(yaml.SafeLoader):
    """YAML's safe loader, plus what rl_zoo3's ``yaml.dump`` writes beyond plain values."""

    trusted: tuple[str, ...] = TRUSTED_PACKAGES


def _construct_ordered_dict(loader: _RunFolderLoader, node: yaml.Node) -> dict[Any, Any]:
    # yaml.dump writes an OrderedDict as its constructor's arguments: one list of [key, value] pairs
    if not (isinstance(node, yaml.SequenceNode) and len(node.value) == 1):
        raise yaml.constructor.ConstructorError(None, None, "an OrderedDict of other arguments", node.start_mark)
    pairs = loader.construct_sequence(node.value[0], deep=True)
    if not all(isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str) for pair in pairs):
        raise yaml.constructor.ConstructorError(None, None, "an OrderedDict not of [key, value] pairs", node.start_mark)
    return dict(pairs)


def _construct_tuple(loader: _RunFolderLoader, node: yaml.Node) -> tuple[Any, ...]:
    if not isinstance(node, yaml.SequenceNode):
        raise yaml.constructor.ConstructorError(None, None, "a tuple that is not a sequence", node.start_mark)
    return tuple(loader.construct_sequence(node, deep=True))


def _construct_class(loader: _RunFolderLoader, suffix: str, node: yaml.Node) -> type:
    # A class rl_zoo3 evaluated from --hyperparams (policy_kwargs' activation_fn=nn.ReLU): only of trusted packages,
    # whose modules are imported anyway
    module, _, name = suffix.rpartition(".")
    if not (module and _in_packages(module, loader.trusted)):
        raise yaml.constructor.ConstructorError(
            None, None, f"the name {suffix}, not a class of {', '.join(loader.trusted)}", node.start_mark
        )
    try:
        value = getattr(importlib.import_module(module), name, None)
    except ImportError:
        value = None
    if not isinstance(value, type):
        raise yaml.constructor.ConstructorError(None, None, f"the name {suffix}, not a class", node.start_mark)
    return value


def _construct_undefined(loader: _RunFolderLoader, node: yaml.Node) -> None:
    tag = node.tag.removeprefix("tag:yaml.org,2002:")
    raise yaml.constructor.ConstructorError(
        None, None, f"the tag !!{tag}, which rl-zoo does not write (a python/ tag imports and calls)", node.start_mark
    )


_RunFolderLoader.add_constructor(None, _construct_undefined)
_RunFolderLoader.add_constructor(_ORDERED_DICT_TAG, _construct_ordered_dict)
_RunFolderLoader.add_constructor(_TUPLE_TAG, _construct_tuple)
_RunFolderLoader.add_multi_constructor(_NAME_PREFIX, _construct_class)


def _expanded_size(node: yaml.Node, sizes: dict[int, int], depth: int = 0) -> int:
    """The number of values ``node`` stands for with its aliases expanded (``sizes``: the nodes counted so far)."""
    known = sizes.get(id(node))
    if known is not None:
        if known < 0:
            raise ValueError("an alias to the value it is part of")
        return known
    if depth > MAX_YAML_DEPTH:
        raise ValueError(f"values nested deeper than {MAX_YAML_DEPTH}")
    sizes[id(node)] = -1
    if isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    elif isinstance(node, yaml.MappingNode):
        children = [child for pair in node.value for child in pair]
    else:
        children = []
    size = 1
    for child in children:
        size += _expanded_size(child, sizes, depth + 1)
        if size > MAX_YAML_NODES:
            raise ValueError(f"more than {MAX_YAML_NODES} values with its aliases expanded")
    sizes[id(node)] = size
    return size


def load_run_yaml(text: str, path: str | Path, trust: Sequence[str] = ()) -> Any:
    """
    Read a YAML document of a run folder (``config.yml``, ``args.yml``) as data.

    :param text: the document
    :param path: its file, for the message
    :param trust: modules (or packages) of your own whose classes the document may name
    :return: the document's value: plain values, dicts (rl-zoo's ``OrderedDict``), tuples, classes of the SB3 family
    :raises RunFolderError: for any other tag (``!!python/object/apply:os.system`` ...), aliases that expand beyond
        :data:`MAX_YAML_NODES` values, invalid YAML
    """
    loader = _RunFolderLoader(text)
    loader.trusted = (*TRUSTED_PACKAGES, *trust)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node, {})
        return loader.construct_document(node)
    except yaml.constructor.ConstructorError as error:
        raise RunFolderError(path, None, one_line(str(error.problem))) from None
    except yaml.YAMLError as error:
        raise RunFolderError(path, None, f"invalid YAML ({one_line(str(error))})") from None
    except (ValueError, RecursionError) as error:
        reason = str(error) if isinstance(error, ValueError) else "nested too deeply"
        raise RunFolderError(path, None, reason) from None
    finally:
        loader.dispose()


def read_run_yaml(path: str | Path, trust: Sequence[str] = ()) -> Any:
    """
    :param path: a run folder's ``config.yml`` or ``args.yml``
    :param trust: modules (or packages) of your own whose classes it may name
    :return: its value, read by :func:`load_run_yaml`
    :raises RunFolderError: as :func:`load_run_yaml`, and for a file larger than :data:`MAX_YAML_BYTES`
    """
    with open(path, "rb") as file:
        raw = file.read(MAX_YAML_BYTES + 1)
    if len(raw) > MAX_YAML_BYTES:
        raise RunFolderError(path, None, f"larger than {MAX_YAML_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise RunFolderError(path, None, "not UTF-8 text") from None
    return load_run_yaml(text, path, trust)


def _first_code(tree: ast.AST) -> str:
    """What in an expression is not a literal, in a few words."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id == "dict"):
            return f"a call of {ast.unparse(node.func)}"
        if isinstance(node, ast.Attribute):
            return f"attribute access {ast.unparse(node)}"
        if isinstance(node, ast.Lambda):
            return "a lambda"
        if isinstance(node, ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp):
            return "a comprehension"
        if isinstance(node, ast.Name) and node.id != "dict":
            return f"the name {node.id}"
    return "not a literal"


def parse_literal(text: str) -> Any:
    """
    The value of a field that rl_zoo3 evaluates with ``eval``, parsed without running it: a Python literal, or a
    ``dict(...)`` call whose keyword arguments are literals (rl-zoo's ``"dict(norm_obs=True, norm_reward=False)"``).

    :param text: the field's string
    :return: its value
    :raises ValueError: naming what is not a literal (a call, attribute access, a lambda, a comprehension, a name)
    """
    if len(text) > MAX_LITERAL_CHARS:
        raise ValueError(f"longer than {MAX_LITERAL_CHARS} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        raise ValueError(f"not a Python expression ({type(error).__name__})") from None
    try:
        if isinstance(tree, ast.Call) and isinstance(tree.func, ast.Name) and tree.func.id == "dict" and not tree.args:
            if any(keyword.arg is None for keyword in tree.keywords):
                raise ValueError("dict(**...)")
            return {keyword.arg: ast.literal_eval(keyword.value) for keyword in tree.keywords}
        return ast.literal_eval(tree)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        raise ValueError(f"{_first_code(tree)}, not a literal") from None


def _normalize_kwargs(value: Any, path: Path, norm_reward: bool, test_mode: bool) -> dict[str, Any]:
    # As rl_zoo3's get_saved_hyperparams, with the string parsed instead of evaluated
    if isinstance(value, str):
        try:
            kwargs = parse_literal(value)
        except ValueError as error:
            shown = repr(value) if len(value) <= 80 else f"{value[:80]!r}..."
            raise RunFolderError(path, "normalize", f"{shown}: {error}") from None
        if not (isinstance(kwargs, dict) and all(isinstance(key, str) for key in kwargs)):
            raise RunFolderError(path, "normalize", f"{value!r} is not a dict of VecNormalize's arguments")
        if test_mode:
            kwargs["norm_reward"] = norm_reward
        return kwargs
    if isinstance(value, dict):
        return value
    if isinstance(value, bool | int):
        return {"norm_obs": value, "norm_reward": norm_reward}
    raise RunFolderError(path, "normalize", f"a {type(value).__name__}, not a bool, a dict or its string")


def _wrapper_names(value: Any) -> Iterator[Any]:
    # rl_zoo3's forms: a name, {name: kwargs}, or a list of these
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, dict) and len(item) == 1:
            name, kwargs = next(iter(item.items()))
            if not isinstance(kwargs, dict):
                yield item  # refused below
                continue
            yield name
        else:
            yield item


def wrapper_modules(config: dict[str, Any]) -> tuple[str, ...]:
    """
    :param config: a run's hyperparameters, as :func:`read_run_yaml` reads them
    :return: the modules of the wrapper classes named by their ``env_wrapper`` / ``vec_env_wrapper``
    """
    names = [name for field in WRAPPER_FIELDS if config.get(field) is not None for name in _wrapper_names(config[field])]
    return tuple(name.rpartition(".")[0] for name in names if isinstance(name, str) and "." in name)


def _check_wrappers(config: dict[str, Any], path: Path, trusted: Sequence[str]) -> None:
    for field, base in WRAPPER_FIELDS.items():
        value = config.get(field)
        if value is None:
            continue
        for name in _wrapper_names(value):
            if isinstance(name, type):
                wrapper = name  # read by the loader from a trusted package
            elif isinstance(name, str) and "." in name:
                module, _, attribute = name.rpartition(".")
                if not _in_packages(module, trusted):
                    reason = f"{name} is not a class of {', '.join(trusted)} (--trust MODULE: your own)"
                    raise RunFolderError(path, field, reason)
                try:
                    wrapper = getattr(importlib.import_module(module), attribute)
                except (ImportError, AttributeError) as error:
                    raise RunFolderError(path, field, f"{name}: {one_line(str(error))}") from None
            else:
                raise RunFolderError(path, field, f"{name!r} is not a class name, a {{name: kwargs}} or a list of them")
            if not (isinstance(wrapper, type) and issubclass(wrapper, base)):
                raise RunFolderError(path, field, f"{name} is not a {base.__module__}.{base.__qualname__}")


def _read_mapping(path: Path, what: str, trust: Sequence[str]) -> dict[str, Any] | None:
    """A run folder's YAML mapping (:func:`read_run_yaml`), or None without the file; ``what`` names its values."""
    if not path.is_file():
        return None
    value = read_run_yaml(path, trust)
    if not isinstance(value, dict):
        raise RunFolderError(path, None, f"a {type(value).__name__}, not a mapping of {what}")
    return value


def read_config(stats_path: str | Path, trust: Sequence[str] = ()) -> dict[str, Any] | None:
    """
    Read and check a run's ``config.yml`` (its hyperparameters): the fields that rl_zoo3's ``enjoy`` runs, ``normalize``
    and the wrappers, must be data and classes of the SB3 family or of ``trust``.

    :param stats_path: the run's ``<run folder>/<env>`` folder
    :param trust: modules (or packages) of your own whose classes it may name
    :return: the hyperparameters, or None without ``config.yml``
    :raises RunFolderError: naming the file, the field and why
    """
    path = Path(stats_path, "config.yml")
    config = _read_mapping(path, "hyperparameters", trust)
    if config is None:
        return None
    if config.get("normalize"):
        _normalize_kwargs(config["normalize"], path, False, False)
    if not isinstance(config.get("frame_stack", 0), int):
        raise RunFolderError(path, "frame_stack", f"{config['frame_stack']!r} is not a number of frames")
    _check_wrappers(config, path, (*TRUSTED_PACKAGES, *trust))
    return config


def read_args(stats_path: str | Path, trust: Sequence[str] = ()) -> dict[str, Any] | None:
    """
    Read and check a run's ``args.yml`` (rl_zoo3.train's options).

    :param stats_path: the run's ``<run folder>/<env>`` folder
    :param trust: modules (or packages) of your own whose classes it may name
    :return: the options, or None without ``args.yml``
    :raises RunFolderError: naming the file, the field and why
    """
    path = Path(stats_path, "args.yml")
    args = _read_mapping(path, "options", trust)
    if args is None:
        return None
    if not isinstance(args.get("env_kwargs"), dict | None):
        raise RunFolderError(path, "env_kwargs", f"a {type(args['env_kwargs']).__name__}, not a mapping")
    return args


def saved_hyperparams(
    stats_path: str, norm_reward: bool = False, test_mode: bool = False, trust: Sequence[str] = ()
) -> tuple[dict[str, Any], str | None]:
    """
    rl_zoo3's ``get_saved_hyperparams``, reading ``config.yml`` with :func:`read_config`.

    :param stats_path: the run's ``<run folder>/<env>`` folder
    :param norm_reward: whether to normalize rewards, where ``normalize`` is a bool or (``test_mode``) a string
    :param test_mode: whether the environment is for testing (the saved ``norm_reward`` is replaced)
    :param trust: modules (or packages) of your own whose classes it may name
    :return: the hyperparameters, with ``normalize_kwargs`` where they normalize, and ``stats_path`` (None if it is
        not a folder)
    :raises RunFolderError: naming the file, the field and why
    """
    if not Path(stats_path).is_dir():
        return {}, None
    config = read_config(stats_path, trust)
    if config is None:
        hyperparams: dict[str, Any] = {"normalize": Path(stats_path, "obs_rms.pkl").is_file()}
    else:
        hyperparams = {**config, "normalize": config.get("normalize", False)}
    if hyperparams["normalize"]:
        hyperparams["normalize_kwargs"] = _normalize_kwargs(
            hyperparams["normalize"], Path(stats_path, "config.yml"), norm_reward, test_mode
        )
    return hyperparams, stats_path


class _RunFolderYaml:
    """What rl_zoo3's ``enjoy`` uses of the ``yaml`` module (``yaml.load(f, Loader=yaml.UnsafeLoader)``), safe."""

    UnsafeLoader = None

    def __init__(self, trust: Sequence[str]) -> None:
        self.trust = tuple(trust)

    def load(self, stream: IO[str], Loader: Any = None) -> Any:
        path = getattr(stream, "name", "<yaml>")
        text = stream.read(MAX_YAML_BYTES + 1)
        if len(text) > MAX_YAML_BYTES:
            raise RunFolderError(path, None, f"larger than {MAX_YAML_BYTES} characters")
        return load_run_yaml(text, path, self.trust)


_FindModel = Callable[..., tuple[str, str, str]]


def _checking_model_path(find: _FindModel, trust: Sequence[str]) -> _FindModel:
    @functools.wraps(find)
    def find_and_check(*args: Any, **kwargs: Any) -> tuple[str, str, str]:
        found = find(*args, **kwargs)
        # Before enjoy reads anything of the run: args are (exp_id, folder, algo, env_name, ...)
        env_name = kwargs.get("env_name", args[3] if len(args) > 3 else None)
        stats_path = Path(found[2], str(env_name))
        read_config(stats_path, trust)
        read_args(stats_path, trust)
        return found

    return find_and_check


@contextlib.contextmanager
def run_folder_reading(trust: Sequence[str] = ()) -> Iterator[None]:
    """
    Inside this block, rl_zoo3's ``enjoy`` reads the run folder it plays as this module does: its ``config.yml`` and
    ``args.yml`` are checked as soon as the folder is found, before anything of it is used, and read as data.

    :param trust: modules (or packages) of your own whose classes the run's files may name
    """
    saved = rl_zoo3.enjoy.get_model_path, rl_zoo3.enjoy.get_saved_hyperparams, rl_zoo3.enjoy.yaml
    rl_zoo3.enjoy.get_model_path = _checking_model_path(rl_zoo3.enjoy.get_model_path, trust)
    rl_zoo3.enjoy.get_saved_hyperparams = functools.partial(saved_hyperparams, trust=tuple(trust))
    rl_zoo3.enjoy.yaml = _RunFolderYaml(trust)
    try:
        yield
    finally:
        rl_zoo3.enjoy.get_model_path, rl_zoo3.enjoy.get_saved_hyperparams, rl_zoo3.enjoy.yaml = saved
