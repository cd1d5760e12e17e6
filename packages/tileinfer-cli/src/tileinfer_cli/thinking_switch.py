"""``--think`` and ``--no-think``: the chat template's ``enable_thinking`` variable (Qwen3's,
SmolLM3's). A template that never reads that variable has no switch to turn, so the flag would
be silently ignored; it is refused instead, with one line naming the model, as ollama refuses
``--think`` for a model without a thinking mode. Whether the template reads it is asked of the
template's own source (its parsed variables), not of a list of model names."""

from __future__ import annotations

from .errors import UserError

SWITCH = "enable_thinking"


def check_thinking_switch(args):
    """Before the weights load: a UserError for --think when the chat template has no thinking
    switch, and for --no-think when such a template starts every answer in a <think> block
    (DeepSeek-R1's distills); --no-think with a template that never thinks is what it asks for."""
    if getattr(args, "thinking", None) is None or getattr(args, "raw", False):
        return  # --raw with --think is refused by check_template_options
    from tileinfer import ChatMessage, ChatTemplateError, chat_prompt, resolve_model_dir
    from tileinfer.io.chat_template import load_chat_template, template_variables

    from .reasoning import prompt_is_thinking
    from .templates import template_from

    folder = resolve_model_dir(args.model)
    template = template_from(args, folder)
    try:
        source = template.source if args.chat_template else load_chat_template(folder)
        if SWITCH in template_variables(source):
            return
    except ChatTemplateError:
        return  # no usable template: rendering the prompt says so in its own words
    whose = (f"the chat template {args.chat_template}" if args.chat_template
             else f"{args.model or folder.name}'s chat template")
    if args.thinking:
        raise UserError(f"--think: {whose} has no thinking mode (it reads no {SWITCH}): the "
                        "model answers as it always does")
    prompt = chat_prompt(template, [ChatMessage("user", "Hi")], add_generation_prompt=True)
    if prompt_is_thinking(prompt):
        raise UserError(f"--no-think: {whose} starts every answer in a <think> block and reads "
                        f"no {SWITCH} to turn that off")
