"""`ernie-tui demo-model DIR --shape ...` and `ernie-tui demo`."""

from __future__ import annotations

import argparse

from ernie_tui import paths


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo-model", help="write a random-weight ERNIE-4.5 stand-in model",
                       description="Write a random-weight Ernie4_5ForCausalLM checkpoint with a word-level "
                                   "tokenizer (N space-separated words = N tokens). 'tiny' (fp16) serves on vLLM's "
                                   "CPU backend; 'ernie-4.5-0.3b' has the real 0.3B shapes (bf16, ~0.7 GB).")
    p.add_argument("dir", help="directory to write the model into")
    p.add_argument("--shape", choices=["tiny", "ernie-4.5-0.3b"], default="tiny")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=_demo_model)

    d = sub.add_parser("demo", help="make the tiny model (once) and open the dashboard on the cpu-demo preset",
                       description="Generate the tiny stand-in model into the user data dir if it is missing, "
                                   "then open the dashboard in control mode with the cpu-demo preset started. "
                                   "Presets that name no model serve the tiny model (or the global --model DIR).")
    d.add_argument("--preset", default="cpu-demo", dest="demo_preset")
    d.set_defaults(run=_demo)


def _demo_model(args) -> int:
    from ernie_tui.demo_model import write_demo_model  # lazy: --help start-up

    s = write_demo_model(args.dir, args.shape, args.seed)
    print(f"wrote {s['name']} model to {s['path']}: {s['parameters']:,} parameters, "
          f"{s['num_hidden_layers']} layers, hidden {s['hidden_size']}, heads {s['num_attention_heads']}/"
          f"{s['num_key_value_heads']} KV, head_dim {s['head_dim']}, vocab {s['vocab_size']}, "
          f"{s['max_position_embeddings']} positions")
    return 0


def ensure_demo_model() -> str:
    from ernie_tui.demo_model import write_demo_model, written_as  # lazy: --help start-up

    target = paths.demo_model_dir()
    # written_as checks the dtype too: a tiny model from an older version (bf16,
    # whose AMX kernels die on some VMs) is written again as it is made now.
    if not written_as(target, "tiny"):
        paths.private_dir(target.parent)  # the data dir is ernie-tui's own: 0700
        print(f"writing the tiny demo model to {target} ...")
        write_demo_model(target, "tiny")
    return str(target)


def demo_args(args):
    """The dashboard's arguments for `demo`: its preset, started, and a model
    for every preset that names none (--model if given, else the tiny one)."""
    tiny = ensure_demo_model()
    args.model = getattr(args, "model", None) or tiny
    args.preset = args.demo_preset
    args.start = True
    return args


def _demo(args) -> int:
    from ernie_tui.cli.dashboard import run_dashboard  # lazy: --help start-up

    return run_dashboard(demo_args(args))
