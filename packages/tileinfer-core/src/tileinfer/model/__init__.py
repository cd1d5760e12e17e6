"""The model layer: config, weights (and INT8 / FP8 quantization), RoPE tables, the decoder and
its loader. It imports the backend and io layers, never the engine."""

from .config import ConfigError, ModelConfig, config_from_dict, load_config
from .decoder import Model, StepBuffers, max_length
from .loader import load_model
from .quant import (Fp8Weight, Fp8WeightOnly, Int8Weight, QuantizedWeight, quantize_fp8,
                    quantize_int8)
from .rope import rope_tables
from .weights import WeightsError, load_weights, weight_bytes
