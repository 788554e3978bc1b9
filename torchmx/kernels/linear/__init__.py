"""Linear layers with MX weights on CUDA: `dispatch` picks the kernel for a product (weight,
rows, device) and keeps the decision; the kernels it picks from sit beside it (`byte_gemv`,
`mma_linear`, `fp4_wgmma_matmul`, `stream_matmul`, `matmul_kernels`, and `mx_gemm` for MX
activations)."""
