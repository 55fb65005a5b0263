"""Load a bsi-compressed model with plain transformers, without bsi installed.

bsi copies this file into every compressed-model folder, and the folder's
``config.json`` points transformers at it (``auto_map``), so that ::

    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)

gives the same model, with the same logits, as ``bsi.load_compressed(folder)``.
It needs torch, transformers and safetensors only (a folder with int8
weights, written by ``bsi export --quantize int8``, also optimum-quanto).

Why ``trust_remote_code=True``: a compressed model is not the original
architecture with its usual weights. Some linear layers became two smaller
linear layers in a row, ``down`` (in -> k) and ``up`` (k -> out), and
transformers' own classes have no place for them. ``config.json`` therefore names the model type ``bsi_compressed``,
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

Every compressed layer holds two ordinary ``nn.Linear`` modules, so tools
that act on linear layers see them: weight-only quantizers (torchao,
optimum-quanto) quantize both factors, and PEFT's LoRA can target them (the
module names end in ``.down`` and ``.up``, e.g. ``target_modules=["up",
"down"]``, or ``"all-linear"``). Folders written before this layout (their
tensors named ``<layer>.A``, ``<layer>.B`` and ``<layer>.bias``) load the
same way: the names are mapped on reading (:func:`current_names`).

The model loads onto one device. ``device_map`` may name it (``"cpu"``,
``"cuda:0"``, ``{"": "cuda:0"}``, a map whose every entry is the same
device) or be ``"auto"`` (the first GPU, else the CPU); the options that only
matter when a model is spread over devices (``max_memory``,
``offload_folder``, ``offload_state_dict``, ``offload_buffers``) have nothing
to do and are accepted, so lm-evaluation-harness's ``hf`` model loads the
folder with its defaults and with ``parallelize=True``. Options that would
load it wrong are refused with a sentence saying what to do instead: a map
over several devices or onto disk, and quantizing while loading
(``quantization_config``, ``load_in_8bit``, ``load_in_4bit``: quantize the
loaded model, see ``bsi export --quantize``).
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
#: loading options for a model spread over devices or offloaded: nothing to do for a model on one device
_ONE_DEVICE_KWARGS = ("max_memory", "offload_folder", "offload_state_dict", "offload_buffers")
#: quantizing while loading: this loader would silently skip it, so it is refused
_QUANTIZE_KWARGS = ("quantization_config", "load_in_8bit", "load_in_4bit")


class CompressedFolderError(ValueError):
    """A compressed-model folder whose files are missing, damaged or do not belong together."""


class LowRankLinear(nn.Module):
    """A compressed layer: two linear layers in a row, ``y = up(down(x)) = (x B^T) A^T + b``.

    ``down`` is an ``nn.Linear`` (in -> k, no bias) holding ``B`` (k, in);
    ``up`` is an ``nn.Linear`` (k -> out, with the layer's bias) holding
    ``A`` (out, k). The same modules, tensor names and arithmetic as bsi's own
    ``LowRankLinear`` (``bsi.method.layers``), which bsi uses when it loads a
    folder itself.
    """

    def __init__(self, in_features: int, out_features: int, rank: int, bias: bool) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.up = nn.Linear(rank, out_features, bias=bias)  # registered first: parameters in the order A, (bias), B
        self.down = nn.Linear(in_features, rank, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (..., in) -> (..., k) -> (..., out)
        return self.up(self.down(x))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, rank={self.down.out_features}"


def current_names(state: Mapping[str, torch.Tensor], layers: Mapping[str, Mapping[str, Any]]) -> dict[str, torch.Tensor]:
    """``state`` with an older folder's low-rank tensor names mapped to the two-linear layout; others unchanged.

    Before the factors became ``nn.Linear`` modules a low-rank layer ``L``
    stored ``L.A`` (out, k), ``L.B`` (k, in) and ``L.bias``; they are now
    ``L.up.weight``, ``L.down.weight`` and ``L.up.bias``, the same tensors.
    """
    renamed: dict[str, str] = {}
    for name, spec in layers.items():
        if spec.get("kind") == "lowrank":
            renamed |= {f"{name}.A": f"{name}.up.weight", f"{name}.B": f"{name}.down.weight",
                        f"{name}.bias": f"{name}.up.bias"}
    return {renamed.get(key, key): tensor for key, tensor in state.items()}


class BSICompressedConfig(PretrainedConfig):
    """``config.json`` of a compressed folder: ``base_config`` (the original model's) and ``bsi_layers``."""

    model_type = MODEL_TYPE


def compressed_config(base: PretrainedConfig, layers: Mapping[str, Mapping[str, Any]],
                      quantization: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``config.json`` content of a folder for a model with config ``base``, layer table ``layers``.

    ``quantization`` (``bsi_quantization``): how the weights were quantized,
    for a folder written by ``bsi export --quantize``.
    """
    values = json.loads(base.to_json_string(use_diff=False))
    return {
        **({"bsi_quantization": dict(quantization)} if quantization else {}),
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


def load_quantized_weights(model: nn.Module, state: Mapping[str, torch.Tensor], quantization: Mapping[str, Any],
                           device: torch.device) -> None:
    """Fill a model from :func:`build_model` with the weights of a quantized folder (``bsi export --quantize``).

    ``quantization`` is ``config.json``'s ``bsi_quantization``: the library
    (optimum-quanto), its scheme and its map of quantized modules. The
    modules it names are replaced by the library's quantized ones, then every
    tensor is loaded and the output layer tied again.

    Raises:
        CompressedFolderError: the library is missing, or a tensor is missing
            or does not fit.
    """
    if quantization.get("library") != "optimum-quanto":
        raise CompressedFolderError(f"config.json names the quantization library {quantization.get('library')!r}, "
                                    "which this loader does not know; upgrade bsi")
    try:
        from optimum.quanto import requantize
    except ImportError:
        raise CompressedFolderError("the folder holds int8 weights quantized with optimum-quanto, which is not "
                                    "installed: pip install optimum-quanto") from None
    try:
        requantize(model, dict(state), dict(quantization["map"]), device=device)
    except (RuntimeError, KeyError, ValueError) as err:
        raise CompressedFolderError(f"{WEIGHTS} does not fit the quantized model of config.json "
                                    f"({' '.join(str(err).split())[:200]}); re-export the model") from None
    model.tie_weights()
    expected = model.state_dict()
    loaded = {t.data_ptr() for n, t in expected.items() if n in state}  # a tied tensor shares a loaded one's storage
    missing = [n for n, t in expected.items() if n not in state and t.data_ptr() not in loaded]
    if missing:
        raise CompressedFolderError(f"{WEIGHTS} lacks tensor '{missing[0]}' (and {len(missing) - 1} more); "
                                    "re-export the model")


def _dtype(value: Any) -> torch.dtype | None:
    """``from_pretrained``'s dtype argument: None or ``"auto"`` keep the stored dtype."""
    if value is None or value == "auto":
        return None
    if isinstance(value, str):
        value = getattr(torch, value, None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"dtype must be 'auto', a torch dtype or its name, got {value!r}")
    return value


def _device(device_map: Any, max_memory: Any = None) -> torch.device:
    """The one device a compressed model goes to.

    ``device_map`` may be None (the CPU), a device (``"cpu"``, ``"cuda:0"``,
    ``0``), ``"auto"`` (the first GPU that ``max_memory`` allows, else the
    CPU) or a dict whose entries all name the same device (transformers'
    ``{"": device}``).

    Raises:
        ValueError: a map over several devices, or onto ``"disk"`` or ``"meta"``.
    """
    if isinstance(device_map, Mapping):
        devices = {str(torch.device(d) if isinstance(d, int) else d) for d in device_map.values()}
        if len(devices) != 1:
            raise ValueError(f"a bsi-compressed model loads onto one device, but device_map spreads it over "
                             f"{', '.join(sorted(devices)) or 'no device'}: pass device_map={{'': 'cuda:0'}} (or "
                             "'cpu'), or leave parallelize off")
        device_map = devices.pop()
    if device_map is None:
        return torch.device("cpu")
    if device_map in ("auto", "balanced", "balanced_low_0", "sequential"):
        gpus = [k for k in (max_memory or {}) if isinstance(k, int) or str(k).startswith("cuda")]
        if not torch.cuda.is_available():
            return torch.device("cpu")
        return torch.device(gpus[0] if gpus else "cuda")
    if device_map in ("disk", "meta"):
        raise ValueError(f"a bsi-compressed model cannot be loaded onto '{device_map}': pass device_map='cpu', "
                         "'cuda:0' or 'auto'")
    if isinstance(device_map, (str, int, torch.device)):
        return torch.device(device_map)
    raise ValueError(f"device_map {device_map!r} is not a device: pass device_map='cpu', 'cuda:0' or 'auto'")


class BSICompressedForCausalLM(PreTrainedModel):
    """The loader transformers calls for a ``bsi_compressed`` folder (through ``auto_map``).

    It is never instantiated: :meth:`from_pretrained` returns the original
    architecture's model (e.g. ``LlamaForCausalLM``) whose compressed layers
    are :class:`LowRankLinear`.
    """

    config_class = BSICompressedConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # see the class docstring
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
            device_map: one device (``"cpu"``, ``"cuda:0"``, ``{"": "cuda:0"}``) or ``"auto"`` (see the module docstring).
            attn_implementation: passed to the original architecture.
        """
        hub = {k: kwargs.pop(k) for k in _HUB_KWARGS if k in kwargs}
        one_device = {k: kwargs.pop(k) for k in _ONE_DEVICE_KWARGS if k in kwargs}
        quantize = sorted(k for k in _QUANTIZE_KWARGS if kwargs.pop(k, None) not in (None, False))
        if quantize:
            raise ValueError(f"a bsi-compressed model does not quantize while loading ({', '.join(quantize)}): load "
                             "it without, then quantize the loaded model (torchao's quantize_, optimum-quanto), or "
                             "write a quantized folder with `bsi export --quantize int8`")
        unused = sorted(k for k, v in kwargs.items() if v is not None and not k.startswith("_") and k not in _IGNORED_KWARGS)
        if model_args or unused:
            raise TypeError(f"bsi-compressed models do not take {', '.join(unused) or 'positional arguments'}")
        device = _device(device_map, one_device.get("max_memory"))  # a wrong map is refused before anything loads
        source = pretrained_model_name_or_path
        if config is None:
            config = BSICompressedConfig.from_pretrained(source, **hub)
        # the auto classes hand attn_implementation to the config they read
        attn_implementation = attn_implementation or getattr(config, "_attn_implementation", None)
        model = build_model(base_config(config.base_model_type, config.base_config), config.bsi_layers,
                            attn_implementation=attn_implementation)
        state = current_names(read_weights(cached_file(source, WEIGHTS, **hub)), config.bsi_layers)
        quantization = getattr(config, "bsi_quantization", None)
        if quantization:
            load_quantized_weights(model, state, quantization, device)
        else:
            load_weights(model, state)
        try:
            model.generation_config = GenerationConfig.from_pretrained(source, **hub)
        except OSError:  # a folder saved without generation_config.json keeps the config's defaults
            pass
        cast = _dtype(dtype if dtype is not None else torch_dtype)
        model = model.to(device=device, dtype=cast) if cast is not None else model.to(device)
        return model.eval()
