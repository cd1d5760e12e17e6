"""How the prompt is made: the model's chat template, another one (``--chat-template FILE``), or
none at all (``--raw``: the text is completed as it is)."""

from __future__ import annotations

from .errors import UserError


def add_template_options(p, raw: bool):
    g = p.add_argument_group("prompt format")
    g.add_argument("--chat-template", metavar="FILE",
                   help="a Jinja chat template file used instead of the model's (with the "
                        "model's special tokens: bos_token, eos_token, ...)")
    if raw:
        g.add_argument("--raw", action="store_true",
                       help="no chat template: the model continues the prompt text as it is "
                            "(the tokenizer adds its BOS where the model wants one)")


def check_template_options(args):
    """Before anything loads: the options that --raw leaves without meaning, and a
    --chat-template file that cannot be read or does not compile."""
    if getattr(args, "raw", False):
        clash = [flag for flag, given in (("--chat-template", args.chat_template is not None),
                                          ("--system", args.system is not None),
                                          ("--think/--no-think", args.thinking is not None))
                 if given]
        if clash:
            raise UserError(f"--raw uses no chat template, so {' and '.join(clash)} cannot "
                            "apply")
    elif args.chat_template is not None:
        from tileinfer.io.chat_template import read_template_file

        read_template_file(args.chat_template, ".")


def template_from(args, folder):
    """What to render prompts with: None for --raw, the --chat-template file with the folder's
    special tokens, else the folder (its own template)."""
    if getattr(args, "raw", False):
        return None
    if args.chat_template is None:
        return folder
    from tileinfer.io.chat_template import read_template_file

    return read_template_file(args.chat_template, folder)
