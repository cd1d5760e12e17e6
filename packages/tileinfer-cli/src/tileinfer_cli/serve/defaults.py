"""The sampling defaults of a server: what a request that leaves out ``temperature``, ``top_p``,
``top_k``, ``min_p`` or ``repetition_penalty`` gets.

Each comes from the model's generation_config.json where the file sets it (whatever its
``do_sample``, as vLLM does), else from OpenAI's API: temperature 1.0, top_p 1.0, and top_k,
min_p and the repetition penalty off (OpenAI has none of them). So a model without sampling
settings samples, as OpenAI's endpoints do, where ``tileinfer run`` (which follows transformers'
``do_sample``) decodes greedily. ``/v1/models``
shows them (``sampling_defaults``), and so does the start-up line.
"""

from __future__ import annotations

from dataclasses import dataclass

OPENAI_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
                   "repetition_penalty": 1.0}


@dataclass(frozen=True)
class SamplingDefaults:
    temperature: float
    top_p: float
    top_k: int  # 0: off
    min_p: float  # 0: off
    repetition_penalty: float  # 1: off
    from_model: tuple[str, ...]  # the names generation_config.json set

    @classmethod
    def of_folder(cls, folder) -> "SamplingDefaults":
        """ValueError if generation_config.json holds values that are not numbers, or that
        SamplingParams refuses."""
        from tileinfer import SamplingParams
        from tileinfer.io import sampling_settings

        settings = sampling_settings(folder)
        values = {**OPENAI_DEFAULTS, **settings}
        values["top_k"] = max(0, values["top_k"])  # -1 (vLLM's "off") as 0
        try:
            SamplingParams(values["temperature"], values["top_k"], values["top_p"],
                           min_p=values["min_p"],
                           repetition_penalty=values["repetition_penalty"])
        except ValueError as e:
            raise ValueError(f"generation_config.json: unusable sampling settings: {e}") from None
        names = tuple(name for name in OPENAI_DEFAULTS if name in settings)
        return cls(values["temperature"], values["top_p"], values["top_k"], values["min_p"],
                   values["repetition_penalty"], names)

    def card(self) -> dict:
        """The ``sampling_defaults`` field of /v1/models."""
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                "min_p": self.min_p, "repetition_penalty": self.repetition_penalty,
                "from_generation_config": list(self.from_model)}

    def describe(self) -> str:
        """For the start-up line, e.g. ``temperature 0.6, top_p 0.95 (generation_config.json)``."""
        values = f"temperature {self.temperature:g}, top_p {self.top_p:g}"
        if self.top_k:
            values += f", top_k {self.top_k}"
        if self.min_p:
            values += f", min_p {self.min_p:g}"
        if self.repetition_penalty != 1.0:
            values += f", repetition_penalty {self.repetition_penalty:g}"
        if not self.from_model:
            return f"{values} (OpenAI's; generation_config.json sets none)"
        if len(self.from_model) == len(OPENAI_DEFAULTS):
            return f"{values} (generation_config.json)"
        return f"{values} ({', '.join(self.from_model)} from generation_config.json)"
