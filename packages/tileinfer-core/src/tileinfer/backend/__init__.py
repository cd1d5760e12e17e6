"""The backend layer: the op contract (hookspecs), its argument types, the registry that resolves
a backend's ops into an ``OpTable``, allocating op wrappers, and the sampling definition every
backend's sampling ops follow. It imports nothing else of tileinfer."""

from .hookspecs import MAX_TOP_K, Invariance, hookimpl, hookspec
from .registry import (ALLOW_ENV, ENTRY_POINT_GROUP, FALLBACK, OP_NAMES, OPTIONAL_OPS, Backend,
                       BackendError, BackendInfo, OpTable, default_backend_name, get_backend,
                       list_backends, registry)
from .sampling import SamplingParams
from .types import AttentionStep, LayerKV, QKTransform, XIELUScalars
