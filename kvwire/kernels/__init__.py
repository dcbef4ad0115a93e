"""Triton kernels over compact KV pages (each module: kernels, launcher, torch reference, benchmark).

- ``kvwire.kernels.quantize``: ``write_pages`` (quantise-on-write, bit-identical to
  ``kvwire.quant.quantize_pages``) and ``write_pages_reference``.
- ``kvwire.kernels.paged_decode``: ``paged_decode_attention`` (split-KV paged decode over pages + bf16
  tail) and ``paged_decode_reference``.
- ``kvwire.kernels.chunk_attention``: ``paged_chunk_attention`` (chunked prefill / prefix hits) and
  ``paged_chunk_reference``; its tile and split policy in ``chunk_plan``. For wide chunks after long
  prefixes, ``chunk_gathered`` decodes the prefix to bf16 (``page_gather.gather_pages``) for cuDNN's
  attention and merges the rest from ``paged_chunk_attention``.
- ``paged_decode_cuda`` / ``quantize_cuda``: the CUDA kernels of ``cuda/`` (compiled by NVRTC), and
  ``cuda_emulator``, which runs them on the CPU for the tests.

The submodules import triton; on CPU tensors (without TRITON_INTERPRET=1) every launcher runs its
torch reference instead; with it, Triton kernels run in Triton's interpreter and, for the "cuda"
backend, the CUDA kernels in the warp emulator. Benchmarks and measured numbers: docs/benchmarks.md.
"""
