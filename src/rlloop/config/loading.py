"""A run config from its layers: defaults, the (algo, env) preset, a YAML file, command-line
flags and ``--set key=value`` pairs, each overriding the one before; the YAML reader (no
duplicate keys), the ``--set`` parser, and the coercion of each value to its field's type
with a one-line error naming the key and, for a misspelt or SB3-named key, rlloop's."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import numbers
import operator
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml

from rlloop.config.appo import check_async_runners
from rlloop.config.presets import preset
from rlloop.config.registry import ALGORITHMS, unknown_algorithm
from rlloop.config.run_config import FIELD_DEFAULTS, RunConfig
from rlloop.errors import ConfigError


def build_config(
    algo: str,
    env: str | None = None,
    *,
    file: str | Path | None = None,
    flags: dict[str, Any] | None = None,
    sets: list[str] | None = None,
    base: dict[str, Any] | None = None,
) -> RunConfig:
    """Resolve a :class:`RunConfig` from its layers (see module docstring).

    ``base`` replaces defaults + preset (used when resuming from a saved config).
    """
    return from_dict(config_layers(algo, env, file=file, flags=flags, sets=sets, base=base))


def config_layers(
    algo: str,
    env: str | None = None,
    *,
    file: str | Path | None = None,
    flags: dict[str, Any] | None = None,
    sets: list[str] | None = None,
    base: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The plain data :func:`build_config` validates: its layers merged, nothing checked
    but the algorithm's name and the file. Reading a setting here needs no torch."""
    if algo not in ALGORITHMS:
        raise ConfigError(unknown_algorithm(algo))
    file_data = load_yaml(file) if file else {}
    # An explicit empty id (``--env=``) is an error for RunConfig, not the default env.
    env_id = next((e for e in (env, (flags or {}).get("env"), file_data.get("env"),
                               (base or {}).get("env")) if e is not None), "CartPole-v1")
    data: dict[str, Any] = {"algo": algo, "env": env_id}
    layers = [base] if base is not None else [preset(algo, env_id)]
    layers += [file_data, {k: v for k, v in (flags or {}).items() if v is not None}]
    for layer in layers:
        _merge(data, layer)
    if file_data.get("algo", algo) != algo:
        raise ConfigError(f"config file {str(file)!r} is for {file_data['algo']}, not {algo}; "
                          f"train it with rlloop train {file_data['algo']} --config {file}")
    others = [k for k in file_data if k in ALGORITHMS and k != algo]
    if others:  # it would be dropped unread, as `--set sac.lr=...` on td3 is refused
        raise ConfigError(f"config file {str(file)!r} has settings for {', '.join(others)}, "
                          f"not {algo}, which this run trains; train "
                          f"{' or '.join(others)} with it, or rename the section to {algo}:")
    data["algo"], data["env"] = algo, env_id
    for item in sets or []:
        key, value = parse_set(item)
        _check_set_target(algo, key)
        _assign(data, key, value)
    return data


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (the plain loader
    keeps the last value silently: ``ppo: {lr: 1e-3, lr: 0.5}`` trains at 0.5)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: list[Any] = []
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` merges, as before
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                twice = key in seen
            except TypeError:  # unhashable keys compare too; the parent refuses them
                twice = False
            if twice:
                raise yaml.constructor.ConstructorError(
                    None, None, f"found the key {key!r} twice in one mapping; keep one",
                    key_node.start_mark)
            seen.append(key)
        return super().construct_mapping(node, deep=deep)


def _safe_load(text: str) -> Any:
    return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no tags


def load_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"config file {str(p)!r} is a directory; pass a YAML file")
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist; pass an existing YAML file")
    try:
        data = _safe_load(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"config file {str(p)!r} is not text (not UTF-8); pass a YAML "
                          "file") from None
    except OSError as e:
        raise ConfigError(f"config file {str(p)!r} cannot be read ({e.strerror}); pass a "
                          "readable YAML file") from None
    except yaml.YAMLError as e:
        line = " ".join(str(e).split())  # PyYAML's messages span lines
        raise ConfigError(f"config file {str(p)!r} is not valid YAML: {line}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(p)!r} must hold a mapping of keys to values")
    return data


def parse_set(item: str) -> tuple[str, Any]:
    """``"ppo.lr=1e-3"`` -> ``("ppo.lr", 0.001)``; values are parsed as YAML scalars."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set expects key=value (e.g. ppo.lr=0.001), got {item!r}")
    try:
        value = _safe_load(raw) if raw.strip() else None
    except yaml.constructor.ConstructorError as e:  # a key twice: no string meant that
        raise ConfigError(f"--set {item!r}: {e.problem}") from None
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def from_dict(data: dict[str, Any]) -> RunConfig:
    """Build and validate a RunConfig from plain data, with typed errors for bad input."""
    data = dict(data)
    algo = data.get("algo", "ppo")
    if algo not in ALGORITHMS:
        raise ConfigError(unknown_algorithm(algo))
    section = data.pop(algo, None) or {}
    _check_recurrent(algo, section)
    other_algos = [k for k in data if k in ALGORITHMS]
    for key in other_algos:
        data.pop(key)
    section_keys = [f.name for f in dataclasses.fields(ALGORITHMS[algo].config_cls)]
    hparams = _build(ALGORITHMS[algo].config_cls, section, prefix=f"{algo}.",
                     other=("", list(FIELD_DEFAULTS)))
    run = _build(RunConfig, {**data, "hparams": hparams}, prefix="",
                 other=(f"{algo}.", section_keys))
    check_async_runners(run)
    return run  # type: ignore[no-any-return]


#: Settings of recurrent policies, which only these algorithms have.
RECURRENT_KEYS = ("recurrent", "recurrent_hidden", "seq_len")
RECURRENT_ALGOS = ("ppo",)


def _check_recurrent(algo: str, section: Any) -> None:
    if algo in RECURRENT_ALGOS or not isinstance(section, dict):
        return
    # ma_ppo's config has these fields (it extends PPO's), left at their feed-forward values.
    fields = {f.name for f in dataclasses.fields(ALGORITHMS[algo].config_cls)}
    key = next((k for k in RECURRENT_KEYS if k in section and (
        k not in fields or (k == "recurrent" and section[k] is not None))), None)
    if key is not None:
        raise _no_recurrent_policy(algo, key)


def _no_recurrent_policy(algo: str, key: str) -> ConfigError:
    return ConfigError(f"{algo}.{key}: {algo} has no recurrent policy; use rlloop train ppo "
                       "--set ppo.recurrent=lstm (or gru), or drop the setting")


def _build(cls: type, data: dict[str, Any], prefix: str,
           other: tuple[str, Sequence[str]] = ("", ())) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.')} must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in names:
            raise _unknown_key(prefix, key, names, other)
        kwargs[key] = value if key == "hparams" else _coerce(value, hints[key], prefix + key)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(f"invalid {prefix.rstrip('.') or 'config'}: {e}") from None


#: Stable-Baselines3 / rl-zoo names a newcomer types, and the rlloop keys they are (the
#: README's translation table): the refusal of such a key names them.
SB3_NAMES: dict[str, tuple[str, ...]] = {
    "learning_rate": ("lr",), "n_steps": ("rollout_steps",),
    "batch_size": ("minibatch_size",), "n_epochs": ("num_epochs",),
    "clip_range": ("clip_coef",), "clip_range_vf": ("clip_vf",),
    "train_freq": ("opt_interval",), "ent_coef": ("init_alpha", "autotune_alpha"),
    "exploration_fraction": ("exploration_steps",), "log_std_init": ("init_log_std",),
    "normalize": ("normalize_obs", "normalize_rewards"), "n_envs": ("num_envs",),
    "n_timesteps": ("total_env_steps",), "total_timesteps": ("total_env_steps",),
    "policy_kwargs": ("hidden", "activation", "ortho_init"), "net_arch": ("hidden",),
    "activation_fn": ("activation",), "verbose": ("progress",),
    "tensorboard_log": ("tensorboard",), "use_rms_prop": ("optimizer",),
    "rms_prop_eps": ("optimizer_eps",), "normalize_advantage": ("normalize_advantages",),
}


def sb3_hint(key: str, *layers: tuple[str, Sequence[str]]) -> str:
    """"Stable-Baselines3's <key> is <rlloop keys> here; " naming the keys (each with its
    layer's prefix) among ``layers`` ``(prefix, keys)``; "" for a key SB3 does not name so."""
    names = [prefix + n for prefix, keys in layers for n in SB3_NAMES.get(key, ()) if n in keys]
    return f"Stable-Baselines3's {key} is {' / '.join(names)} here; " if names else ""


def _unknown_key(prefix: str, key: str, names: Sequence[str],
                 other: tuple[str, Sequence[str]] = ("", ())) -> ConfigError:
    """The refusal of ``prefix + key``; ``other`` is the other layer's ``(prefix, keys)``
    (the algorithm's section for a run key, the run keys for a section's), where the key
    may belong."""
    valid = [n for n in names if n != "hparams"]
    there, elsewhere = other
    hint = sb3_hint(key, (prefix, valid), other)
    close = difflib.get_close_matches(key, valid, n=1)
    if not hint and key in elsewhere:
        hint = f"did you mean {there}{key}? "
    elif not hint and close:
        hint = f"did you mean {prefix}{close[0]}? "
    return ConfigError(f"unknown config key '{prefix}{key}'; {hint}valid keys: "
                       f"{', '.join(prefix + n for n in valid)}")


def check_set_keys(algo: str, sets: Sequence[str]) -> None:
    """The `ConfigError` `build_config` would raise for an unknown key in ``sets`` (``--set``
    items), raised without importing the algorithm (torch's second of import): the keys
    are the fields of its config class, whose module is torch-free. Keys inside sections
    are left to `build_config`.
    """
    run_keys = [f.name for f in dataclasses.fields(RunConfig)]
    for item in sets:
        key = parse_set(item)[0]
        top, _, sub = key.partition(".")
        _check_set_target(algo, key)
        if top == algo and sub:
            name = sub.partition(".")[0]
            keys = [f.name for f in dataclasses.fields(ALGORITHMS[algo].config_cls)]
            if name not in keys:
                if name in RECURRENT_KEYS and algo not in RECURRENT_ALGOS:
                    raise _no_recurrent_policy(algo, name)
                raise _unknown_key(f"{algo}.", name, keys, ("", run_keys))
        elif top not in ALGORITHMS and top not in run_keys:
            keys = [f.name for f in dataclasses.fields(ALGORITHMS[algo].config_cls)]
            raise _unknown_key("", top, run_keys, (f"{algo}.", keys))


def _check_set_target(algo: str, key: str) -> None:
    """ConfigError for a ``--set`` key that would be dropped or switch what the preset
    was chosen for: ``env`` (the id; ``env.<option>`` is fine), ``algo`` or another
    algorithm's section."""
    top = key.partition(".")[0]
    if key == "env":
        raise ConfigError("--set env=... would keep the preset of the other env; pass the "
                          "env as --env ID")
    if top == "algo":
        raise ConfigError(f"--set algo=... cannot change the algorithm; it is the command's "
                          f"argument (rlloop train ALGO), here {algo}")
    if top in ALGORITHMS and top != algo:
        raise ConfigError(f"--set {top}.... does not apply: this run trains {algo}; use "
                          f"--set {algo}.KEY=VALUE")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):  # a section: true = defaults
        if isinstance(value, bool):
            return _build(tp, {}, prefix=f"{key}.") if value else None
        return _build(tp, value, prefix=f"{key}.")
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, arg, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0])
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key} must be one of {list(args)}, got {value!r}")
        return value
    if origin is list:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        return [_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a mapping, got {value!r}")
        return dict(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false, got {value!r}")
        return value
    if tp is int:
        number = _number(value)
        if isinstance(number, int):
            return number
        if isinstance(number, float) and number.is_integer():
            return int(number)
        raise ConfigError(f"{key} must be an integer, got {value!r}")
    if tp is float:
        number = _number(value)
        if number is None:
            raise ConfigError(f"{key} must be a number, got {value!r}")
        return float(number)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key} must be a string, got {value!r}")
        return value
    return value


def _number(value: Any) -> int | float | None:
    """``value`` as a number, or None. Strings count when Python reads them as one: PyYAML
    (YAML 1.1) reads ``4e-3`` and ``1E5`` as strings, though a Python user writes them
    as numbers. So do NumPy integers (anything ``operator.index`` takes), as plain ints,
    and NumPy floats, as plain floats; bools (Python's, NumPy's, torch's) are no numbers
    here."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
        try:
            return float(value)
        except ValueError:
            return None
    if (whole := integer(value)) is not None:
        return whole
    # NumPy floats (np.float32(1e-3): np.float64 is a float already) as plain floats
    return float(value) if isinstance(value, numbers.Real) else None


def integer(value: object) -> int | None:
    """``value`` as a plain int when it is an integer: an int or a NumPy (or torch) integer,
    anything ``operator.index`` takes; None otherwise. Bools (Python's, NumPy's, torch's)
    are no integers."""
    if isinstance(value, bool) or "bool" in str(getattr(value, "dtype", "")):
        return None  # torch.tensor(True) passes operator.index
    try:
        return operator.index(value)  # type: ignore[arg-type]  # np.True_ raises TypeError
    except TypeError:
        return None


def parse_int(text: str) -> int:
    """An integer flag, also written as ``1e6``; ValueError for anything else."""
    number = _number(text)
    if isinstance(number, float) and number.is_integer():
        return int(number)
    if not isinstance(number, int):
        raise ValueError(f"not an integer: {text!r}")
    return number


def _merge(into: dict[str, Any], layer: dict[str, Any] | None) -> None:
    for key, value in (layer or {}).items():
        if isinstance(value, dict) and isinstance(into.get(key), dict) and key != "env_kwargs":
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)  # never alias a preset: --set mutates in place


def _assign(data: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    if len(parts) > 1 and parts[0] == "env":  # env is the id; env.X sets an env option
        parts[0] = "env_kwargs"
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {dotted}: {part!r} is not a section")
        node = child
    node[parts[-1]] = value
