"""`--config FILE`: a YAML file of option defaults; the command line wins over it, it wins over built-ins."""
from __future__ import annotations

from pathlib import Path

import click


def _load(ctx: click.Context, param: click.Parameter, value: str | None):
    if value is None:
        return None
    import yaml

    path = Path(value)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as e:
        raise click.BadParameter(f"{path}: cannot read config ({e})", ctx, param) from None
    if not isinstance(data, dict):
        raise click.BadParameter(f"{path}: a config is a mapping of option names to values", ctx, param)
    known = {p.name for p in ctx.command.params if p.name}
    defaults = {}
    for key, v in data.items():
        name = str(key).replace("-", "_")
        if name not in known or name == "config":
            raise click.BadParameter(f"{path}: unknown option {key!r} for `{ctx.command_path}`", ctx, param)
        defaults[name] = ",".join(map(str, v)) if isinstance(v, list) else v
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return value


def config_option(f):
    """Add an eager `--config FILE` whose values become this command's defaults (click's default_map)."""
    return click.option(
        "--config",
        type=click.Path(exists=True, dir_okay=False),
        is_eager=True,
        expose_value=False,
        callback=_load,
        help="YAML file of option defaults (see configs/); options on the command line win.",
    )(f)
