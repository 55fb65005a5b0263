"""What a layer's dotted name says: the transformer block it sits in, and its kind.

A Hugging Face model names its layers by their path, ``model.layers.3.mlp.up_proj``:
the number is the block, what follows it is the layer's kind, shared by every
block. Tables, heatmaps and layer choices group layers this way. Names only,
no model and no torch.
"""

from __future__ import annotations

import re


def layer_kind(name: str) -> str:
    """The layer's type: its name after the last block index (``model.layers.3.mlp.up_proj`` -> ``mlp.up_proj``)."""
    return re.split(r"\.\d+\.", name)[-1]


def layer_block(name: str) -> int | None:
    """The block index in a layer's name (``model.layers.3.mlp.up_proj`` -> 3), or None outside the blocks."""
    match = re.search(r"\.(\d+)\.", name)
    return int(match.group(1)) if match else None
