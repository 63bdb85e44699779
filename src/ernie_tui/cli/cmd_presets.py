"""`ernie-tui presets list|show|path|delete`."""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import sys
import textwrap

from ernie_tui import paths
from ernie_tui.cli.errors import CliError
from ernie_tui.cli.shared_options import shared_options

# Words that make an environment variable's value a secret: HF_TOKEN,
# OPENAI_API_KEY, AWS_SECRET_ACCESS_KEY, DB_PASSWORD, ... A name is split at
# _ and -, so TOKENIZERS_PARALLELISM stays readable.
_SECRET_WORD = re.compile(r"(?:KEYS?|TOKENS?|SECRETS?|PASSWORD|PASSWD|PASS|PASSPHRASE|CREDENTIALS?|AUTH|COOKIE)$"
                          r"|^(?:SECRET|PASSWORD|PRIVATE)")
MASK = "***"


def looks_secret(name: str) -> bool:
    return any(_SECRET_WORD.search(part) for part in re.split(r"[_\-.]", name.upper()) if part)


def masked_env(env: dict[str, str], also: tuple[str, ...] = ()) -> dict[str, str]:
    """`env` for showing to a person: values of secret-looking names (and of
    `also`, e.g. the preset's api_key_env) replaced by ***."""
    return {k: (MASK if k in also or looks_secret(k) else v) for k, v in env.items()}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("presets", help="list presets, show one, print where user presets live, delete one",
                       description="List presets, show one (with --command: the exact argv and env), "
                                   "print the path of the user presets file, or delete a preset from it. "
                                   "Environment values whose "
                                   "name looks like a secret (KEY, TOKEN, SECRET, PASSWORD, ...) show as ***.")
    ps = p.add_subparsers(dest="presets_command", metavar="ACTION", required=True)
    lst = ps.add_parser("list", parents=[shared_options(top_level=False)],
                        help="every preset with its key arguments and description; warns (on stderr) of "
                             "engine-arg keys the installed vLLM does not have, with the nearest it has")
    lst.add_argument("--json", action="store_true")
    lst.set_defaults(run=_list)
    show = ps.add_parser("show", parents=[shared_options(top_level=False)],
                         help="one preset (with the same warning of unknown engine-arg keys)")
    show.add_argument("name")
    show.add_argument("--command", action="store_true", help="print the exact argv and env that launch it")
    show.add_argument("--json", action="store_true")
    show.set_defaults(run=_show)
    path = ps.add_parser("path", help="print the user presets file path")
    path.set_defaults(run=_path)
    delete = ps.add_parser("delete", help="remove a preset from the user presets file (a NAME-fixed copy, say)",
                           description="Remove [presets.NAME] from the user presets file, keeping the rest of "
                                       "the file and its comments. A built-in of the same name shows again.")
    delete.add_argument("name")
    delete.set_defaults(run=_delete)


def _book(args):
    from ernie_tui.presets import load_presets  # lazy: --help start-up

    return load_presets(args.presets)


def _typo_warnings(presets) -> list[str]:
    """One line per engine-arg key the preset's vLLM does not have, with the
    nearest argument it does have (the same "did you mean" as `check`)."""
    from ernie_tui.engine_ctl.launch import launcher_python, unknown_arguments, vllm_args  # lazy: --help start-up

    lines = []
    for p in presets:
        args = vllm_args(launcher_python(p), allow_dump=False)
        for key, near in unknown_arguments(p, args):
            hint = (f"did you mean {near}? (`ernie-tui check {p.name}` offers the rename)" if near
                    else "vLLM would exit with 'unrecognized arguments'")
            lines.append(f"warning: {p.name}: {key} is not an argument of vLLM {args.version}; {hint}")
    return lines


def _warn(lines: list[str]) -> None:
    for line in lines:
        print(line, file=sys.stderr)


def _list(args) -> int:
    book = _book(args)
    presets = list(book)
    if args.json:
        print(json.dumps([{"name": p.name, "source": p.source, "description": p.description,
                           "engine_args": p.engine_args} for p in presets], indent=2))
        _warn(_typo_warnings(presets))
        return 0
    width = max([len("NAME"), *(len(n) for n in book.names())])
    argw = max([len("KEY ARGUMENTS"), *(len(p.key_args() or "-") for p in presets)])
    print(f"{'NAME':<{width}}  {'KEY ARGUMENTS':<{argw}}  SOURCE")
    for p in presets:
        print(f"{p.name:<{width}}  {p.key_args() or '-':<{argw}}  {p.source}")
        if p.description:
            print(textwrap.fill(p.description, width=max(60, shutil.get_terminal_size().columns - 1),
                                initial_indent=" " * (width + 2), subsequent_indent=" " * (width + 2)))
    _warn(_typo_warnings(presets))
    return 0


def _show(args) -> int:
    book = _book(args)
    preset = book.get(args.name)
    _warn(_typo_warnings([preset]))
    if args.command:
        from ernie_tui.cli.model_choice import model_for  # lazy: --help start-up

        choice = model_for(preset, args.model)
        _warn([f"note: {choice.note}"] if choice.note else [])
        spec = preset.launch_spec(choice.model)
        env_shown = masked_env(spec.display_env(), spec.secret_env_keys)
        if args.json:
            print(json.dumps({"argv": spec.argv, "env": env_shown}, indent=2))
        else:
            env = " ".join(f"{k}={shlex.quote(v)}" for k, v in env_shown.items())
            print((env + " " if env else "") + shlex.join(spec.argv))
        return 0
    info = {"name": preset.name, "source": preset.source, "description": preset.description,
            "model": preset.model, "host": preset.host, "port": preset.port,
            "engine_args": preset.engine_args, "env": masked_env(preset.env), "launcher": preset.launcher}
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        for k, v in info.items():
            if v not in (None, {}, ""):
                print(f"{k}: {v}")
    return 0


def _path(args) -> int:
    print(paths.user_presets_file())
    return 0


def _delete(args) -> int:
    from ernie_tui.presets.store import delete_preset  # lazy: --help start-up

    if not delete_preset(args.name):
        raise CliError(f"{paths.user_presets_file()}: has no preset {args.name!r}")
    print(f"deleted {args.name!r} from {paths.user_presets_file()}")
    return 0
