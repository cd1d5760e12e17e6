from .config import ConfigError, ModelConfig, config_from_dict, load_config
from .rope import rope_tables
from .quant import Int8Weight, quantize_int8
from .weights import WeightsError, load_weights, weight_bytes
from .cache import (ContextLengthError, OutOfPagesError, PagedKVCache, Sequence,
                    calibrate_key_smoothing, key_smoothing_from_calibration, kv_bytes_per_token)
from .step import StepMetadata, prepare_step
from .model import Model, StepBuffers, forward, forward_batch, load_model, max_length
