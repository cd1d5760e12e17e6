"""The conformance suite: each op of a backend against the ref backend on the same random inputs.

    pytest --pyargs tileinfer.testing.conformance --tileinfer-backend NAME

collects the test modules of this package, one per op family: ``test_norms`` (embed, rmsnorm,
add_rmsnorm, the optional gemma_rmsnorm and add_gemma_rmsnorm), ``test_linear`` (linear,
linear_swiglu, linear_xielu), ``test_attention`` (attention_inputs, attention with
attention_workspace, attention_window, the optional attention_with_inputs), ``test_sampling``
(sample_tokens, accept_tokens), ``test_scratch`` (reserve_scratch), ``test_batch_invariance``
(for a backend that declares batch-invariant ops), ``test_linear_fp8`` (the linear ops with
e4m3 weights, for a backend that declares them; the weight-only e4m3 cases of ``test_linear``
likewise skip for a backend without ``fp8_weight_only``) and ``test_e4m3_input`` (the optional
e4m3-input ops, for a backend with FP8 that implements them); the fixtures are in ``conftest``. A
test file elsewhere takes every test and fixture in with ``from tileinfer.testing.conformance
import *``.
The shared helpers (``fill_paged_step``, ``Cache``, ``assert_close``, ...) are in ``helpers``
and are re-exported here.
"""

from .conftest import device, ops, ref
from .helpers import (ATTENTION_CASES, CACHE_KINDS, DTYPES, INT8_POISON, INT_POISON, SAMPLING,
                      TOLERANCE, WINDOW_CASES, XIELU, Cache, assert_cache_equal, assert_close, attention_step,
                      decode_step_inputs, fill_paged_step, make_fp8_weight, make_weight, poisoned,
                      qk_transform,
                      quantize_weight, rand, rope_tables, seed_counter, write_pages)
from .test_batch_invariance import (invariant_ops, test_attention_rows_are_the_same_however_they_come,
                                    test_linear_rows_are_the_same_in_steps_of_any_size)
from .test_attention import (test_attention, test_attention_inputs, test_attention_window,
                             test_attention_with_inputs)
from .test_linear import (test_batch_invariant_rows, test_e4m3_weight_only_reads_every_value,
                          test_linear, test_linear_float32_model, test_linear_swiglu,
                          test_linear_xielu)
from .test_e4m3_input import (e4m3_ops, test_e4m3_input_linear_writes_what_the_plain_op_writes,
                              test_e4m3_norm_of_a_zero_row,
                              test_e4m3_norm_writes_add_rmsnorms_rows_and_their_quantization)
from .test_linear_fp8 import (fp8_ops, test_fp8_linear, test_fp8_mlp,
                              test_fp8_rows_are_the_same_in_steps_of_any_size,
                              test_fp8_rows_of_outliers_and_zeros,
                              test_fp8_step_rows_are_the_same_as_alone)
from .test_norms import (test_add_gemma_rmsnorm, test_add_rmsnorm, test_embed,
                         test_gemma_rmsnorm, test_gemma_rmsnorm_in_place_on_head_views,
                         test_rmsnorm)
from .test_sampling import (test_accept_tokens, test_sample_per_row, test_sample_tokens,
                            test_sample_tokens_after_logit_processing,
                            test_sample_tokens_with_sums)
from .test_scratch import test_reserve_scratch

__all__ = [
    # fixtures
    "device", "ops", "ref", "invariant_ops", "fp8_ops", "e4m3_ops",
    # tests, one or more per op of the contract
    "test_embed", "test_rmsnorm", "test_add_rmsnorm", "test_gemma_rmsnorm",
    "test_gemma_rmsnorm_in_place_on_head_views", "test_add_gemma_rmsnorm",
    "test_linear", "test_linear_float32_model", "test_linear_swiglu", "test_linear_xielu",
    "test_e4m3_weight_only_reads_every_value",
    "test_batch_invariant_rows",
    "test_attention_inputs", "test_attention", "test_attention_window",
    "test_attention_with_inputs",
    "test_reserve_scratch", "test_sample_tokens", "test_accept_tokens", "test_sample_per_row",
    "test_sample_tokens_with_sums",
    "test_sample_tokens_after_logit_processing",
    "test_linear_rows_are_the_same_in_steps_of_any_size",
    "test_attention_rows_are_the_same_however_they_come",
    "test_fp8_linear", "test_fp8_mlp", "test_fp8_rows_of_outliers_and_zeros",
    "test_fp8_step_rows_are_the_same_as_alone", "test_fp8_rows_are_the_same_in_steps_of_any_size",
    "test_e4m3_norm_writes_add_rmsnorms_rows_and_their_quantization",
    "test_e4m3_norm_of_a_zero_row",
    "test_e4m3_input_linear_writes_what_the_plain_op_writes",
    # helpers
    "ATTENTION_CASES", "CACHE_KINDS", "DTYPES", "INT8_POISON", "INT_POISON", "SAMPLING",
    "TOLERANCE", "WINDOW_CASES", "XIELU", "Cache", "assert_cache_equal", "assert_close", "attention_step",
    "decode_step_inputs", "fill_paged_step", "make_fp8_weight", "make_weight", "poisoned",
    "qk_transform",
    "quantize_weight", "rand", "rope_tables", "seed_counter", "write_pages",
]
