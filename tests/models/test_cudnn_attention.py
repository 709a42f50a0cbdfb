"""`avoid_cudnn_attention`: takes cuDNN out of PyTorch's attention on CUDA devices only, and can be opted out of."""
from __future__ import annotations

import pytest
import torch

from rlfactory.models.devices import CUDNN_ATTENTION_ENV, avoid_cudnn_attention


@pytest.fixture
def cudnn_sdp_on():
    before = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(True)
    yield
    torch.backends.cuda.enable_cudnn_sdp(before)


def test_cuda_devices_turn_cudnn_attention_off(cudnn_sdp_on, monkeypatch):
    monkeypatch.delenv(CUDNN_ATTENTION_ENV, raising=False)
    assert avoid_cudnn_attention("cpu") is False
    assert torch.backends.cuda.cudnn_sdp_enabled()  # CPU runs leave the process setting alone
    assert avoid_cudnn_attention(torch.device("cuda", 0)) is True
    assert not torch.backends.cuda.cudnn_sdp_enabled()
    assert torch.backends.cuda.mem_efficient_sdp_enabled()  # the length-agnostic backends stay on


def test_the_environment_variable_keeps_cudnn_attention(cudnn_sdp_on, monkeypatch):
    monkeypatch.setenv(CUDNN_ATTENTION_ENV, "1")
    assert avoid_cudnn_attention("cuda") is False
    assert torch.backends.cuda.cudnn_sdp_enabled()
