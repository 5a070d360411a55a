"""The config as command-line options: one ``--flag`` per chosen field (its type, choices, help and
default come from the field), ``--section.field=value`` for any other, a YAML file under both, and
the help text that lists every field and each env family's defaults. ``treegym train`` and
``treegym sft`` are built with ``add_config_command`` and read back with ``config_from_args``.
"""

from __future__ import annotations

import argparse
from typing import Any

from treegym.envs.registry import FAMILIES, VARIANTS
from treegym.trainers.config import (
    FAMILY_FIELDS,
    FAMILY_LR,
    TrainConfig,
    family_defaults,
    get_path,
    leaf_paths,
    load_config,
    parse_overrides,
)


def env_defaults_text() -> str:
    """Each env family's defaults as help lines: they apply under the YAML file and the command
    line, and a registered variant (``X-Train-v0``) gets its base env's."""
    lines = ["Defaults per env family (a YAML file or --field=value still wins):"]
    for env_id, fam in FAMILIES.items():
        values = [f"{k}={v}" for k, v in family_defaults(env_id).items()]
        if fam.lr:  # a learning rate per algorithm, each tuned for the family
            values.append(f"{FAMILY_LR} " + " ".join(f"{a}={lr:g}" for a, lr in fam.lr.items()))
        lines.append(f"  {env_id}: " + (", ".join(values) or "(the trainer's own)"))
    lines.append("Each env trains on its training variant, when it has one (evaluation is never shaped):")
    for variant, (base, kwargs) in VARIANTS.items():
        lines.append(f"  {base} -> {variant}: " + ", ".join(f"{k}={v}" for k, v in kwargs.items()))
    return "\n".join(lines) + "\n"


def help_text() -> str:
    """One line per field: path, default, choices and help (for ``treegym train --help``)."""
    lines = []
    defaults = TrainConfig()
    for path, f in leaf_paths().items():
        obj = get_path(defaults, path)
        choices = f.metadata.get("choices")
        extra = f" {{{','.join(map(str, choices))}}}" if choices else ""
        lines.append(f"  --{path}={obj!r}{extra}\n        {f.metadata.get('help', '')}")
    return "\n".join(lines)


def add_options(parser: Any, flags: dict[str, str]) -> None:
    """One ``--flag`` per ``flag -> config path``, with the field's type, choices, help and default
    (a bool field with default False is a bare switch). A flag not given stays unset, so that the
    env family's defaults and a YAML file apply under it; ``given_overrides`` collects the rest."""
    paths, defaults = leaf_paths(), TrainConfig()
    for flag, path in flags.items():
        meta, default = paths[path].metadata, get_path(defaults, path)
        family = " when the env family sets none" if path in FAMILY_FIELDS or path == FAMILY_LR else ""
        help_ = f"{meta.get('help', '')} (default {default!r}{family}; config field {path})".replace("%", "%%")
        kwargs: dict[str, Any] = {"dest": path, "default": argparse.SUPPRESS, "help": help_}
        if default is False:
            kwargs.update(action="store_const", const="true")
        elif meta.get("choices"):
            kwargs.update(choices=[str(c) for c in meta["choices"]])
        else:
            kwargs.update(metavar=type(default).__name__.upper())
        parser.add_argument(f"--{flag}", **kwargs)


def given_overrides(args: Any, flags: dict[str, str]) -> list[tuple[str, Any]]:
    """The ``(path, value)`` of each flag of ``add_options`` that the command line gave."""
    return [(path, getattr(args, path)) for path in flags.values() if hasattr(args, path)]


def add_config_command(subparsers: Any, name: str, flags: dict[str, str], func: Any, **parser_kwargs: Any) -> None:
    """A subcommand whose options are config fields: ``--config`` (a YAML file), the ``flags``
    (``add_options``), ``--no-progress``, and any field as ``--section.field=value``."""
    p = subparsers.add_parser(name, formatter_class=argparse.RawDescriptionHelpFormatter, **parser_kwargs)
    p.add_argument("--config", help="YAML file of config fields (nested by section), under the flags")
    add_options(p, flags)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=func, accepts_overrides=True)


def config_from_args(args: Any, flags: dict[str, str]) -> TrainConfig:
    """The config a command line of ``add_config_command`` asks for: the YAML file, then the flags,
    then the overrides."""
    return load_config(args.config, given_overrides(args, flags) + parse_overrides(getattr(args, "overrides", []) or []))
