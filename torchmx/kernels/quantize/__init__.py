"""Quantize and dequantize on CUDA: the Triton kernels (`_tl_*`), the backend behind the
custom ops (`triton_backend`) and the choice of backend by device (`backends`)."""
