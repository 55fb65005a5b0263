"""Load a bsi-compressed model with plain transformers, without bsi installed.

bsi copies this file into every compressed-model folder, and the folder's
``config.json`` points transformers at it (``auto_map``), so that ::

    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)

gives the same model, with the same logits, as ``bsi.load_compressed(folder)``.
It needs torch, transformers and safetensors only.

Why ``trust_remote_code=True``: a compressed model is not the original
architecture with its usual weights. Some linear layers became two factors
``A`` (out, k) and ``B`` (k, in), and transformers' own classes have no place
for them. ``config.json`` therefore names the model type ``bsi_compressed``,
which transformers does not know: loading without this file fails with an
error instead of building the original architecture and filling every
compressed layer with random weights. The folder's ``config.json`` holds

* ``base_model_type`` and ``base_config``: the original model's type
  (``llama``, ``qwen2``, ...) and full config. The type is kept outside the
  config on purpose: transformers' own classes look for a nested config of
  their type, and ``LlamaForCausalLM.from_pretrained(folder)`` would then
  build the model with random compressed layers;
* ``vocab_size``: a sentence saying how to load the folder. A concrete class
  (``LlamaForCausalLM.from_pretrained(folder)``) reads the top level as its
  own config and stops on this value with that sentence in its error, instead
  of building its default (7B-parameter) architecture;
* ``bsi_layers``: one entry per compressed layer, e.g.
  ``"model.layers.0.mlp.down_proj": {"kind": "lowrank", "in": 128, "out": 64,
  "rank": 12, "bias": false}`` (``"kind": "dense"`` layers stay ``nn.Linear``).

Loading builds the original architecture from ``base_config`` with its
parameters on the ``meta`` device (no memory, no random initialisation), puts
a :class:`LowRankLinear` where the table says ``lowrank``, checks every
tensor's name and shape against that model, and loads ``model.safetensors``.
What comes back is an instance of the original architecture's class (for
example ``LlamaForCausalLM``) in eval mode: ``forward`` and ``generate`` work
as usual. Saving it again with ``save_pretrained`` does not write a loadable
folder; to get an ordinary dense checkpoint use ``bsi export --dense``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn
from torch.nn.modules.module import register_module_parameter_registration_hook
from transformers import AutoModelForCausalLM, GenerationConfig, PretrainedConfig, PreTrainedModel
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.utils import cached_file

MODEL_TYPE = "bsi_compressed"
HOW_TO_LOAD = ("a bsi-compressed model: load it with AutoModelForCausalLM.from_pretrained(folder, "
               "trust_remote_code=True) or bsi.load_compressed(folder)")
WEIGHTS = "model.safetensors"
MODULE_FILE = "modeling_bsi.py"
AUTO_MAP = {
    "AutoConfig": "modeling_bsi.BSICompressedConfig",
    "AutoModelForCausalLM": "modeling_bsi.BSICompressedForCausalLM",
}

#: keyword arguments of ``from_pretrained`` that locate files (passed on to ``cached_file``)
_HUB_KWARGS = ("cache_dir", "force_download", "local_files_only", "proxies", "revision", "subfolder", "token")
#: keyword arguments transformers' auto classes pass along that do not concern this loader
_IGNORED_KWARGS = ("trust_remote_code", "adapter_kwargs", "code_revision", "use_safetensors", "low_cpu_mem_usage")


class CompressedFolderError(ValueError):
    """A compressed-model folder whose files are missing, damaged or do not belong together."""


class LowRankLinear(nn.Module):
    """A compressed layer: ``y = (x B^T) A^T + b``, ``A`` (out, k), ``B`` (k, in).

    The same tensors, names and arithmetic as bsi's own ``LowRankLinear``
    (``bsi.method.layers``), which bsi uses when it loads a folder itself.
    """

    def __init__(self, in_features: int, out_features: int, rank: int, bias: bool) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.A = nn.Parameter(torch.empty(out_features, rank))
        self.B = nn.Parameter(torch.empty(rank, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (..., in) -> (..., k) -> (..., out)
        return nn.functional.linear(nn.functional.linear(x, self.B), self.A, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, rank={self.A.shape[1]}"


class BSICompressedConfig(PretrainedConfig):
    """``config.json`` of a compressed folder: ``base_config`` (the original model's) and ``bsi_layers``."""

    model_type = MODEL_TYPE


def compressed_config(base: PretrainedConfig, layers: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The ``config.json`` content of a compressed folder for a model with config ``base`` and layer table ``layers``."""
    values = json.loads(base.to_json_string(use_diff=False))
    return {
        "model_type": MODEL_TYPE,
        "architectures": ["BSICompressedForCausalLM"],
        "auto_map": dict(AUTO_MAP),
        "vocab_size": HOW_TO_LOAD,  # see the module docstring: stops the original class from misreading the folder
        "base_model_type": values.pop("model_type"),
        "base_config": values,
        "bsi_layers": {name: dict(spec) for name, spec in layers.items()},
    }


def base_config(model_type: str, values: Mapping[str, Any]) -> PretrainedConfig:
    """The original model's config object from ``base_model_type`` and ``base_config`` of ``config.json``."""
    if model_type not in CONFIG_MAPPING:
        raise CompressedFolderError(
            f"config.json names the original model type {model_type!r}, which this transformers version does not "
            "know; upgrade transformers"
        )
    return CONFIG_MAPPING[model_type].from_dict({k: v for k, v in values.items() if k != "model_type"})


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built inside get their parameters on the ``meta`` device; buffers stay real.

    The model then costs no memory and no random initialisation before its
    real tensors are assigned. Buffers such as the rotary frequencies are
    computed from the config as usual. The hook is process-wide while it is
    active: build nothing else in another thread meanwhile.
    """

    def to_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> nn.Parameter | None:
        if param is None or param.device.type == "meta":
            return None  # keep as registered
        return nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    handle = register_module_parameter_registration_hook(to_meta)
    try:
        yield
    finally:
        handle.remove()


def build_model(base: PretrainedConfig, layers: Mapping[str, Mapping[str, Any]], *,
                layer_class: type[nn.Module] = LowRankLinear, attn_implementation: str | None = None) -> nn.Module:
    """The original architecture with a ``layer_class`` where ``layers`` says ``lowrank``; parameters on ``meta``.

    Raises:
        CompressedFolderError: when the table names a layer the architecture does not have.
    """
    kwargs = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    with parameters_on_meta():
        model = AutoModelForCausalLM.from_config(base, **kwargs)
        for name, spec in layers.items():
            if spec.get("kind") != "lowrank":
                continue
            parent_name, _, attr = name.rpartition(".")
            try:
                parent = model.get_submodule(parent_name) if parent_name else model
                old = getattr(parent, attr)
            except AttributeError:
                raise CompressedFolderError(f"the layer table names '{name}', which the config's model does not have") from None
            if not isinstance(old, nn.Linear):
                raise CompressedFolderError(f"the layer table names '{name}', which is a {type(old).__name__}, not a linear layer")
            setattr(parent, attr, layer_class(spec["in"], spec["out"], spec["rank"], spec["bias"]))
    return model


def read_weights(file: str) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file (never a pickle)."""
    try:
        return load_file(file)
    except (SafetensorError, OSError, ValueError) as err:
        raise CompressedFolderError(f"'{file}' is not a readable safetensors file ({err}); re-export the model") from None


def load_weights(model: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Assign ``state`` to a model from :func:`build_model`, checking every name and shape first; ties weights.

    Raises:
        CompressedFolderError: a tensor the model does not have, a shape that
            differs from what the config implies, or a parameter left unfilled.
    """
    expected = model.state_dict()
    for name, tensor in state.items():
        if name not in expected:
            raise CompressedFolderError(
                f"{WEIGHTS} holds tensor '{name}' that the model built from config.json does not have")
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise CompressedFolderError(
                f"tensor '{name}' has shape {tuple(tensor.shape)} in {WEIGHTS} but config.json implies "
                f"{tuple(expected[name].shape)}; the files do not belong together")
    model.load_state_dict(dict(state), strict=False, assign=True)
    model.tie_weights()
    missing = [n for n, p in model.named_parameters() if p.device.type == "meta"]
    if missing:
        raise CompressedFolderError(
            f"{WEIGHTS} lacks tensor '{missing[0]}' (and {len(missing) - 1} more); re-export the model")


def _dtype(value: Any) -> torch.dtype | None:
    """``from_pretrained``'s dtype argument: None or ``"auto"`` keep the stored dtype."""
    if value is None or value == "auto":
        return None
    if isinstance(value, str):
        value = getattr(torch, value, None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"dtype must be 'auto', a torch dtype or its name, got {value!r}")
    return value


def _device(device_map: Any) -> torch.device:
    """The one device a compressed model goes to (``device_map`` as a device, or ``"auto"``)."""
    if device_map is None:
        return torch.device("cpu")
    if device_map == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if isinstance(device_map, (str, int, torch.device)):
        return torch.device(device_map)
    raise ValueError("a bsi-compressed model loads onto one device: pass device_map='cpu', 'cuda:0' or 'auto'")


class BSICompressedForCausalLM(PreTrainedModel):
    """The loader transformers calls for a ``bsi_compressed`` folder (through ``auto_map``).

    It is never instantiated: :meth:`from_pretrained` returns the original
    architecture's model (e.g. ``LlamaForCausalLM``) whose compressed layers
    are :class:`LowRankLinear`.
    """

    config_class = BSICompressedConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # noqa: D107 - see the class docstring
        raise TypeError("BSICompressedForCausalLM is a loader: use AutoModelForCausalLM.from_pretrained(folder, "
                        "trust_remote_code=True)")

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: Any, *model_args: Any, config: Any = None,
                        dtype: Any = None, torch_dtype: Any = None, device_map: Any = None,
                        attn_implementation: str | None = None, **kwargs: Any) -> nn.Module:
        """Build the compressed model of a folder (or hub repository); returns it in eval mode.

        Args:
            pretrained_model_name_or_path: the folder (or a hub id holding the same files).
            config: its :class:`BSICompressedConfig` (read from the folder when omitted).
            dtype: ``"auto"``/None keep the stored dtype; else the dtype to cast to.
            device_map: one device (``"cpu"``, ``"cuda:0"``) or ``"auto"``.
            attn_implementation: passed to the original architecture.
        """
        hub = {k: kwargs.pop(k) for k in _HUB_KWARGS if k in kwargs}
        unused = sorted(k for k, v in kwargs.items() if v is not None and not k.startswith("_") and k not in _IGNORED_KWARGS)
        if model_args or unused:
            raise TypeError(f"bsi-compressed models do not take {', '.join(unused) or 'positional arguments'}")
        source = pretrained_model_name_or_path
        if config is None:
            config = BSICompressedConfig.from_pretrained(source, **hub)
        # the auto classes hand attn_implementation to the config they read
        attn_implementation = attn_implementation or getattr(config, "_attn_implementation", None)
        model = build_model(base_config(config.base_model_type, config.base_config), config.bsi_layers,
                            attn_implementation=attn_implementation)
        load_weights(model, read_weights(cached_file(source, WEIGHTS, **hub)))
        try:
            model.generation_config = GenerationConfig.from_pretrained(source, **hub)
        except OSError:  # a folder saved without generation_config.json keeps the config's defaults
            pass
        cast = _dtype(dtype if dtype is not None else torch_dtype)
        model = model.to(device=_device(device_map), dtype=cast) if cast is not None else model.to(_device(device_map))
        return model.eval()
