"""One options type: `cdr.options.RunOptions` defines each user option's default and meaning
once, and the CLI's flags, the gateway's request schema and `GenerationConfig` take theirs from
it. The values are compared face by face, and the faces' source is read to make sure none of
them re-types a default or a wire name (equal values today could drift tomorrow)."""

from __future__ import annotations

import ast
import json
from dataclasses import fields
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import typer

import cdr
from cdr.cli import app
from cdr.errors import InvalidInputError
from cdr.gateway.app_state import Gateway
from cdr.gateway.schemas import GenerationOptions
from cdr.options import (
    DEFAULTS,
    FACE_DEFAULTS,
    OPTION_NAMES,
    RUN_OPTION_NAMES,
    RunOptions,
    meaning,
    spelling,
    wire_names,
)
from cdr.window.config import GenerationConfig, Hooks, Tunables

SRC = Path(cdr.__file__).parent
STORED_V1 = Path(__file__).parent / "data" / "stored_session_v1.json"


def _generate_params() -> dict[str, Any]:
    command = typer.main.get_command(app).commands["generate"]  # type: ignore[attr-defined]
    return {opt: p for p in command.params for opt in p.opts}


def _gateway_options(opts: GenerationOptions | None, cap: int = 20) -> dict[str, Any]:
    """`Gateway.options` on a stand-in gateway with only the setting it reads."""
    stub = SimpleNamespace(settings=SimpleNamespace(max_windows_cap=cap))
    return Gateway.options(stub, opts)  # type: ignore[arg-type]


def test_the_cli_s_defaults_and_help_are_the_options():
    """The CLI's defaults are the faces' (`FACE_DEFAULTS`: the library's, profile focused)."""
    params = _generate_params()
    flagged = [n for n in RUN_OPTION_NAMES if spelling(n).flag is not None]
    assert flagged == list(RUN_OPTION_NAMES)  # every run option is a flag of `cdr generate`
    for name in flagged:
        param = params[spelling(name).flag]  # type: ignore[index]
        assert param.default == getattr(FACE_DEFAULTS, name), name
        assert param.help == meaning(name), name


def test_the_gateway_schema_s_defaults_and_descriptions_are_the_options():
    props = GenerationOptions.model_json_schema()["properties"]
    assert set(wire_names()) == set(props) - {"outline"}
    for wire, name in wire_names().items():
        assert props[wire].get("default") == getattr(FACE_DEFAULTS, name), wire
        assert props[wire]["description"] == meaning(name), wire
    assert wire_names()["window_tokens"] == "generation_tokens"  # the wire name is kept


def test_generation_config_and_the_gateway_s_effective_defaults_are_the_options():
    assert GenerationConfig().run_options() == DEFAULTS == RunOptions()
    empty = _gateway_options(None)
    assert empty == {"max_windows": DEFAULTS.max_windows, "ranking": DEFAULTS.ranking,
                     "profile": FACE_DEFAULTS.profile}
    assert GenerationConfig(**empty).run_options() == FACE_DEFAULTS
    # The operator's cap lowers the default window limit, and refuses more.
    assert _gateway_options(None, cap=3)["max_windows"] == 3
    with pytest.raises(Exception, match="exceeds this gateway's cap of 3"):
        _gateway_options(GenerationOptions(max_windows=4), cap=3)


def test_a_request_s_options_keep_their_stored_names_and_order():
    """The options a session stores are `GenerationConfig` names, in the order stored before
    the one type existed (`window_tokens` arrives as `generation_tokens`)."""
    req = GenerationOptions(max_windows=3, words=900, ranking="mmr", sub_queries=4,
                            window_tokens=512, context_tokens=8192, profile="fresh",
                            memory="off", documents="support")
    stored = _gateway_options(req)
    assert list(stored.items()) == [
        ("max_windows", 3), ("ranking", "mmr"), ("words", 900), ("sub_queries", 4),
        ("generation_tokens", 512), ("context_tokens", 8192), ("profile", "fresh"),
        ("memory", "off"), ("documents", "support")]
    cfg = GenerationConfig(**json.loads(json.dumps(stored)))
    assert (cfg.generation_tokens, cfg.memory, cfg.session_options().memory) == (512, "off", "off")
    # A session stored before: its options still make the same config.
    old = json.loads(STORED_V1.read_text(encoding="utf-8"))["options"]
    assert GenerationConfig(**old).run_options() == RunOptions(max_windows=4, words=600)


def test_knobs_and_hooks_live_apart_from_the_user_s_options():
    user = set(RUN_OPTION_NAMES)
    knobs = {f.name for f in fields(Tunables)}
    hooks = {f.name for f in fields(Hooks)}
    assert not (user & knobs) and not (user & hooks) and not (knobs & hooks)
    assert {f.name for f in fields(GenerationConfig)} == user | knobs | hooks
    assert hooks == {"safety_check", "ranker", "expansion_scorer"}


def test_an_unknown_option_name_is_refused_by_name():
    with pytest.raises(InvalidInputError, match="unknown run option 'window_tokens'"):
        spelling("window_tokens")


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def test_no_face_retypes_a_default_or_a_wire_name():
    """The source itself: the CLI's option defaults are read off `DEFAULTS` (`D.<name>`), the
    schema's option fields are `option_field("<wire>")`, and no config class redefines a user
    option. A literal in any of those places fails here even while it equals today's default."""
    flag_to_name = {spelling(n).flag: n for n in RUN_OPTION_NAMES}
    cli = ast.parse((SRC / "cli" / "__init__.py").read_text(encoding="utf-8"))
    generate = next(n for n in cli.body if isinstance(n, ast.FunctionDef)
                    and n.name == "generate")
    args = generate.args.args
    defaults = dict(zip([a.arg for a in args[len(args) - len(generate.args.defaults):]],
                        generate.args.defaults, strict=True))
    checked = 0
    for arg, node in defaults.items():
        name = flag_to_name.get("--" + arg.replace("_", "-"))
        if name is None:
            continue
        assert ast.unparse(node) == f"D.{name}", (arg, ast.unparse(node))
        checked += 1
    # the rules' flags are made from the option table (`with_rule_options`), none typed here
    assert generate.args.kwarg is not None and generate.args.kwarg.arg == "rules"
    assert "with_rule_options" in {ast.unparse(d) for d in generate.decorator_list}
    assert checked + len(OPTION_NAMES) == len(RUN_OPTION_NAMES)
    import inspect

    from cdr.cli import generate as command

    made = inspect.signature(command).parameters
    assert all(made[n].default == getattr(FACE_DEFAULTS, n) for n in OPTION_NAMES)

    schemas = ast.parse((SRC / "gateway" / "schemas.py").read_text(encoding="utf-8"))
    body = _class(schemas, "GenerationOptions").body
    fields_ = {n.target.id: n.value for n in body
               if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    for wire in wire_names():
        if wire in OPTION_NAMES:  # the rules' fields are made from the table (_rule_fields)
            assert wire not in fields_, wire
            continue
        value = fields_[wire]
        assert isinstance(value, ast.Call) and ast.unparse(value.func) == "option_field", wire
        assert ast.literal_eval(value.args[0]) == wire
    from cdr.gateway.schemas import GenerationOptions
    from cdr.options import OPTION_CHOICES

    for name, choices in OPTION_CHOICES.items():
        prop = GenerationOptions.model_json_schema()["properties"][name]
        assert prop["anyOf"][0]["enum"] == list(choices) and prop["description"] == meaning(name)

    config = ast.parse((SRC / "window" / "config.py").read_text(encoding="utf-8"))
    for cls in ("Tunables", "Hooks", "GenerationConfig"):
        names = {n.target.id for n in _class(config, cls).body
                 if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
        assert not names & set(RUN_OPTION_NAMES), cls
