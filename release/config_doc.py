"""`make docs`: docs/config.md, written from the two settings trees themselves (worker.config and
scheduler.config): every section and key, its type, range and default, and what it is (the field's
description, else the comment written above it in the schema). A test renders it again and fails
when the file differs, so the page cannot drift from the code.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import io
import textwrap
import tokenize
import types
import typing
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

OUT = Path(__file__).resolve().parents[1] / "docs" / "config.md"

HEAD = """\
# Configuration

<!-- Written by `make docs` (release/config_doc.py) from worker/config/schema.py, safety/config.py and
scheduler/config/schema.py; tests/test_docs.py fails when it differs. Edit those. -->

The worker and the scheduler each read one TOML file, loaded into one typed tree. Each component
receives only its own section. An unknown key or a wrong type stops the start with exit code 2 and
one line that names the file and the field, e.g. `configs/x.toml: queue.lease_wiat_s: unknown key`.
A section the file leaves out takes its defaults. Any value can be overridden on the command line
with `--set section.key=value` (the value in TOML syntax); a file can start from another with
`extends = "other.toml"` (relative to itself) and set only what differs. Rules that span sections
(timeouts that must nest, switches a device rules out) are checked at start and named the same way.

The worker: `torchrun ... -m worker --config FILE`, or `launch/node.sh` with `CONFIG=FILE`
([configs/tiny.toml](../configs/tiny.toml), the embedded default;
[configs/flux-schnell.toml](../configs/flux-schnell.toml), production;
[configs/flux-models.toml](../configs/flux-models.toml), two models). The scheduler:
`dit-scheduler --config FILE` ([configs/scheduler.toml](../configs/scheduler.toml), every setting at
its default); its flags each set one field (`dit-scheduler --help` names it) and override the file.
Secrets are never in a file: tokens and the webhook key are read from the environment variables the
`*_env` keys name.
"""


def render() -> str:
    from scheduler.config.schema import SchedulerConfig
    from worker.config.schema import WorkerConfig

    out = [HEAD]
    for title, root in (("The worker", WorkerConfig), ("The scheduler", SchedulerConfig)):
        out.append(f"\n## {title}\n")
        out += _sections(root, [], {})
    return "".join(out)


def _sections(model: type[BaseModel], path: list[str], seen: dict[type, str]) -> list[str]:
    """Markdown for `model`'s own keys, then for each section under it, in the schema's order. A
    section class met again (another model's [limits]) points at where its keys are listed."""
    title = ".".join(path)
    if model in seen:
        return [f"\n### `[{title}]`\n\nOptional: the keys of `[{seen[model]}]`, for this model where they differ.\n"]
    parent = next((c for c in model.__mro__[1:] if c in seen), None)
    if path:
        seen[model] = title
    rows, below = [], []
    notes = _comments(model)
    for name, field in model.model_fields.items():
        if parent is not None and name in parent.model_fields and field.annotation == parent.model_fields[name].annotation:
            continue
        inner, several = _section_of(field.annotation)
        if inner is not None:
            below += _sections(inner, [*path, f"{name}.<id>" if several else name], seen)
            continue
        rows.append(_row(name, field, notes.get(name, "")))
    if not path:
        return below
    doc = _first_paragraph(model.__doc__) if model.__doc__ and model.__doc__ != BaseModel.__doc__ else ""
    text = f"\n### `[{title}]`\n\n" + (f"{doc}\n\n" if doc else "")
    if parent is not None:
        text += f"Every key of `[{seen[parent]}]`" + (", and:\n\n" if rows else ".\n")
    if rows:
        text += "| key | type | default | what it is |\n|---|---|---|---|\n" + "".join(rows)
    return [text, *below]


def _section_of(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """The section class a field holds (itself, optional, or a table of them by id)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    origin, args = get_origin(annotation), get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        found = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        return (found[0], False) if found else (None, False)
    if origin is dict and args and isinstance(args[1], type) and issubclass(args[1], BaseModel):
        return args[1], True
    return None, False


def _row(name: str, field: FieldInfo, note: str) -> str:
    said = field.description or ""
    what = f"{said.rstrip('.')}. {note}" if said and note else said or note
    what = what[0].upper() + what[1:] if what else ""
    return f"| `{name}` | {_type(field.annotation)}{_bounds(field)} | {_default(field)} | {_cell(what)} |\n"


def _type(annotation: Any) -> str:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return "one of " + ", ".join(f"`{_toml(a)}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        kinds = [_type(a) for a in args if a is not type(None)]
        return " or ".join(kinds) + (" (optional)" if type(None) in args else "")
    if origin is typing.Annotated:
        return _type(args[0])
    if origin in (tuple, list):
        item = args[0] if args else Any
        return f"list of {_type(item)}"
    if origin is dict:
        return f"table of {_type(args[1])}" if len(args) == 2 else "table"
    if annotation is Path:
        return "path"
    return {str: "string", int: "integer", float: "number", bool: "boolean"}.get(annotation, getattr(
        annotation, "__name__", str(annotation)))


def _bounds(field: FieldInfo) -> str:
    marks = {Ge: (">=", "ge"), Gt: (">", "gt"), Le: ("<=", "le"), Lt: ("<", "lt"), MinLen: ("length >=", "min_length"),
             MaxLen: ("length <=", "max_length")}
    parts = []
    for m in field.metadata:
        for kind, (sign, attr) in marks.items():
            if isinstance(m, kind):
                value = getattr(m, attr)
                parts.append(f"{sign} {value:g}" if isinstance(value, float) else f"{sign} {value}")
    return f", {', '.join(parts)}" if parts else ""


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    return "none" if value is None else f"`{_toml(value)}`"


def _toml(value: Any) -> str:
    if isinstance(value, BaseModel):
        return "{...}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, Path):
        return f'"{value}"'
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    return str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _first_paragraph(doc: str) -> str:
    return " ".join(textwrap.dedent(doc).strip().split("\n\n")[0].split())


def _comments(model: type[BaseModel]) -> dict[str, str]:
    """Each field's comment in the class's source: the comment lines right above it and any comment
    on its own lines."""
    try:
        source = textwrap.dedent(inspect.getsource(model))
    except (OSError, TypeError):
        return {}
    by_line: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            by_line[tok.start[0]] = tok.string.lstrip("#").strip()
    cls = ast.parse(source).body[0]
    body = cls.body
    out, previous_end = {}, cls.lineno  # the class line: a comment above its first field is that field's
    for stmt in body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            above = []
            line = stmt.lineno - 1
            while line > previous_end and line in by_line:
                above.insert(0, by_line[line])
                line -= 1
            own = [by_line[n] for n in range(stmt.lineno, stmt.end_lineno + 1) if n in by_line]
            out[stmt.target.id] = " ".join(above + own)
        previous_end = stmt.end_lineno
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="config_doc", description=__doc__)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    args.out.write_text(render())
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
