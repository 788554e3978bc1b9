"""MXTensor's op table, one concern per module.

- `_registry`: which handler runs an aten op (or an intercepted torch function) on MXTensors.
- `layout`: pure block-placement arithmetic (storage shapes, dims, which views keep blocks whole).
- `storage`: detach/clone/`.to`/pin_memory/copy_/`*_like` (exact by construction).
- `views`: view/reshape/permute/expand/slice/select/split/cat/stack, moving scale bytes and
  packed codes without requantizing.
- `sharding`: `as_strided` onto an MXTensor's own geometry (FSDP2's unsharded parameters).
- `matmul`: the custom op `torch.ops.torchmx.mx_matmul` (exact product of the dequantized
  operands, fp32 accumulation, one rounding) and every matmul routed to it.
- `strict`: the reduction-dim layout warning (`MXLayoutWarning`) and its strict switch.
- `fallback`: the allow-list of ops that run on dequantized values; refusal of writes.
- `export`: torch.export of MXTensors built inside the exported forward (matmuls on their parts,
  a clear TypeError for other ops).

`torchmx.mx_tensor` imports the handler modules at its end (they need the MXTensor class);
`torchmx.aten_ops` re-exports the public names (an import path that existing code uses).
"""
