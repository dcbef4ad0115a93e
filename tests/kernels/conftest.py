"""Kernel tests run Triton's CPU interpreter on machines without CUDA.

TRITON_INTERPRET must be set before triton (and kvwire.kernels) is imported: Triton decides at
decoration time whether a @triton.jit function is interpreted. ``import torch`` does not import
triton, so checking for CUDA first is safe. On a CUDA machine the variable is left alone: the
interpreter tests skip and the ``gpu`` tests run compiled kernels. No other test directory uses
triton, so setting it for the whole session changes nothing else.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
