"""The reduction-dim layout policy of MX matmuls.

MX hardware multiplies blocks that run along the reduction dim (K). A matmul whose MX operand
has its blocks along another dim is still computed exactly, with a one-time MXLayoutWarning;
`set_strict_matmul(True)` / `with strict_matmul():` make it a ValueError instead.
"""

import contextlib
import warnings

__all__ = ["MXLayoutWarning", "set_strict_matmul", "strict_matmul", "reset_layout_warning",
           "check_reduction_layout"]


class MXLayoutWarning(UserWarning):
    """An MX operand of a matmul has its blocks off the reduction dim: exact, but MX hardware
    could not run it."""


_strict = False
_warned = False


def set_strict_matmul(enabled: bool) -> bool:
    """Make matmuls whose MX operands are not blocked along the reduction dim raise ValueError
    (True) instead of warning once (False, the default). Returns the previous setting.
    Under torch.compile the check runs while tracing."""
    global _strict
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, got {type(enabled).__name__}")
    previous, _strict = _strict, enabled
    return previous


@contextlib.contextmanager
def strict_matmul(enabled: bool = True):
    """Context manager form of set_strict_matmul."""
    previous = set_strict_matmul(enabled)
    try:
        yield
    finally:
        set_strict_matmul(previous)


def reset_layout_warning() -> None:
    """Let the next off-reduction-dim MX matmul warn again (the warning is shown once per
    process)."""
    global _warned
    _warned = False


def check_reduction_layout(op_name: str, operand_name: str, block_dim: int, ndim: int,
                           reduction_dim: int) -> None:
    """Warn once (or raise under strict_matmul) when an operand's block axis is not its
    reduction dim (both non-negative)."""
    global _warned
    if block_dim == reduction_dim:
        return
    message = (
        f"{op_name}: operand {operand_name!r} is an MXTensor with blocks along dim {block_dim}, "
        f"not along its reduction dim {reduction_dim}. The result is exact (fp32 product of the "
        f"dequantized operands), but MX hardware could not run this matmul; quantize it with "
        f"block_dim={reduction_dim - ndim} for that.")
    if _strict:
        raise ValueError(message + " (strict_matmul is on)")
    if not _warned:
        _warned = True
        warnings.warn(message + " This warning is shown once.", MXLayoutWarning, stacklevel=5)
