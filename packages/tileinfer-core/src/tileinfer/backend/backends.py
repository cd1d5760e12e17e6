"""What the registry holds: a backend's self-description (``BackendInfo``), a loaded plugin
(``Backend``), the resolved ops of one backend (``OpTable``), and the registry's errors."""

from __future__ import annotations

from dataclasses import dataclass, field


class BackendError(RuntimeError):
    """A backend that is unknown, failed to load, or cannot run on this machine."""


class BackendWarning(UserWarning):
    """Something about the installed backends a user should know (e.g. an unknown name in
    TILEINFER_BACKENDS)."""


@dataclass(frozen=True)
class BackendInfo:
    """What a backend says about itself (docs/writing-a-backend.md has each field).

    name: the backend's name (also its entry point's name). available: whether it can run here;
    reason: why not. devices: the torch device types it runs on ("cuda", "cpu").
    graph_safe: whether its ops can be captured in CUDA graphs (allocate nothing, never sync).
    notes: per-op remarks shown by ``tileinfer backends`` (e.g. "prefill GEMM uses cuBLAS").
    batch_invariant: whether its linear ops keep ``Invariance.BATCH`` and its attention keeps
    ``AttentionStep.batch_invariant`` (docs/determinism.md): a model can then be loaded with
    ``batch_invariant=True``.
    fp8: whether its linear ops take e4m3 weights with per-token e4m3 activations
    (``tileinfer.backend.fp8``): a model can then be loaded with ``quantize="fp8"``.
    fp8_weight_only: whether they take e4m3 weights as bit patterns (uint8) with activations as
    they are (the weight-only product of ``tileinfer.backend.fp8``): a model can then be loaded
    with ``quantize="fp8-weight-only"``.
    """

    name: str
    available: bool
    reason: str = ""
    devices: tuple[str, ...] = ("cuda",)
    graph_safe: bool = True
    notes: dict = field(default_factory=dict)
    batch_invariant: bool = False
    fp8: bool = False
    fp8_weight_only: bool = False


@dataclass
class Backend:
    """A loaded plugin: its info and the ops it implements itself; for an invalid plugin, no info
    and ``error`` (why). ``source``: where it came from (distribution and entry point)."""

    name: str
    info: BackendInfo | None
    plugin: object | None
    implemented: dict = field(default_factory=dict)  # op name -> callable
    error: str = ""  # why the plugin failed to load
    source: str = ""

    @property
    def available(self) -> bool:
        return self.info is not None and self.info.available and not self.error

    @property
    def reason(self) -> str:
        if self.error:
            return self.error
        return self.info.reason if self.info else "no backend info"


class OpTable:
    """The resolved ops of one backend: ``table.linear(out, x, w, None, True)`` calls a function.

    ``fallbacks`` lists the ops taken from the ref backend because the chosen one lacks them. An
    optional op the backend lacks is None.
    """

    def __init__(self, backend: Backend, ops: dict, fallbacks: tuple[str, ...]):
        self.backend = backend
        self.name = backend.name
        self.fallbacks = fallbacks
        self.graph_safe = backend.info.graph_safe if backend.info else False
        self._ops = ops
        for op, fn in ops.items():
            setattr(self, op, fn)

    def __repr__(self):
        return f"OpTable({self.name!r}, fallbacks={list(self.fallbacks)})"
