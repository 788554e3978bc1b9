"""Validation of user arguments, shared by the reference, the custom ops and MXTensor.

Every user mistake becomes a ValueError or TypeError that names the argument and what it
allows, before any arithmetic runs.
"""

from typing import Callable, Optional, Tuple, Union

import torch

from .. import dtypes
from .rounding import ROUNDING_MODES
from .scale import SCALE_MODES

HIGH_PRECISION_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_MAX_INT64 = 2**63 - 1
_MAX_SEED = _MAX_INT64


def is_int(value) -> bool:
    """A Python int (or a symbolic one under torch.compile), not a bool."""
    return isinstance(value, (int, torch.SymInt)) and not isinstance(value, bool)


def _names(dtype_list) -> str:
    return ", ".join(str(d) for d in dtype_list)


def check_tensor(value, arg: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{arg} must be a torch.Tensor, got {type(value).__name__}")
    return value


def check_flat_part(t, arg: str, numel: int, dtype: torch.dtype, device: torch.device,
                    alignment: int, made_by: str) -> None:
    """ValueError unless `t` is a contiguous 1-d `dtype` tensor of `numel` elements on `device`
    whose data is `alignment`-byte aligned: a part of a prepacked weight (`arg` names it, with
    its op) that `made_by` builds."""
    if (not isinstance(t, torch.Tensor) or t.dim() != 1 or t.numel() != numel
            or t.dtype != dtype or not t.is_contiguous() or t.device != device):
        got = (f"{t.dtype} of shape {tuple(t.shape)} on {t.device}"
               if isinstance(t, torch.Tensor) else type(t).__name__)
        raise ValueError(f"{arg} must be a contiguous 1-d {dtype} tensor of {numel} elements on "
                         f"{device} (from {made_by}), got {got}")
    if t.device.type != "meta" and t.data_ptr() % alignment:  # the kernels' vector loads
        raise ValueError(f"{arg} must be {alignment}-byte aligned (a fresh tensor is)")


def check_weight_parts(scale, data, fmt: dtypes.DType, block_size: int,
                       fits: Callable[[dtypes.DType, int, int, int], bool], layout: str,
                       op: str) -> Tuple[int, int]:
    """(N, K) of an MX weight's standard parts (codes `data` [N, packed K] uint8 or int8, scale
    bytes `scale` [N, K / block_size] uint8); ValueError naming `op` unless they are that and
    `fits(fmt, block_size, N, K)` (a prepacked layout's condition, `layout` in words)."""
    N = data.shape[0] if data.dim() == 2 else 0
    K = data.shape[1] * fmt.codes_per_group // fmt.bytes_per_group if data.dim() == 2 else 0
    if (not fits(fmt, block_size, N, K) or tuple(scale.shape) != (N, K // block_size)
            or scale.dtype != torch.uint8 or data.dtype not in (torch.uint8, torch.int8)):
        raise ValueError(f"{op}: needs the parts (data [N, packed K] uint8 or int8, scale "
                         f"[N, K / {block_size}] uint8) of a weight of {layout}, got "
                         f"{fmt.name} data {data.dtype} {tuple(data.shape)} and scale "
                         f"{scale.dtype} {tuple(scale.shape)}")
    return N, K


def check_same_device(a: torch.Tensor, a_arg: str, b: torch.Tensor, b_arg: str) -> None:
    if a.device != b.device:
        raise ValueError(f"{a_arg} and {b_arg} must be on one device, got {a_arg} on {a.device} "
                         f"and {b_arg} on {b.device}")


def check_high_precision_input(data_hp, arg: str = "data_hp") -> torch.Tensor:
    check_tensor(data_hp, arg)
    if data_hp.dtype not in HIGH_PRECISION_DTYPES:
        raise TypeError(f"{arg} must have dtype {_names(HIGH_PRECISION_DTYPES)}, got {data_hp.dtype}")
    return data_hp


def check_target_dtype(target_dtype, arg: str = "target_dtype") -> torch.dtype:
    if target_dtype not in HIGH_PRECISION_DTYPES:
        raise ValueError(f"{arg} must be one of {_names(HIGH_PRECISION_DTYPES)}, got {target_dtype}")
    return target_dtype


def check_block_size(block_size) -> int:
    """An int in [1, 2**63 - 1] (the custom ops' schema holds it in an int64); a block longer
    than its axis is one block of the whole axis."""
    if not is_int(block_size):
        raise TypeError(f"block_size must be an int >= 1 and <= 2**63 - 1, got "
                        f"{type(block_size).__name__}")
    if not 1 <= block_size <= _MAX_INT64:
        raise ValueError(f"block_size must be an int >= 1 and <= 2**63 - 1, got {block_size}")
    return block_size


def normalize_block_dim(block_dim, ndim: int) -> int:
    """block_dim as a non-negative axis; a 0-d tensor counts as one axis of length 1."""
    if not is_int(block_dim):
        raise TypeError(f"block_dim must be an int, got {type(block_dim).__name__}")
    axes = max(ndim, 1)
    if not -axes <= block_dim < axes:
        raise ValueError(f"block_dim must be in [{-axes}, {axes - 1}] for a {ndim}-d tensor, got {block_dim}")
    return block_dim % axes


def check_scale_mode(scale_mode) -> str:
    if scale_mode not in SCALE_MODES:
        raise ValueError(f"scale_mode must be one of {', '.join(SCALE_MODES)}; got {scale_mode!r}")
    return scale_mode


def check_rounding(rounding) -> str:
    if rounding not in ROUNDING_MODES:
        raise ValueError(f"rounding must be one of {', '.join(ROUNDING_MODES)}; got {rounding!r}")
    return rounding


def resolve_seed(seed: Union[int, torch.Generator, None], rounding: str) -> Optional[int]:
    """The integer seed of stochastic rounding: given, drawn from a Generator, or drawn from
    torch's default generator (so torch.manual_seed makes it reproducible). None otherwise."""
    if rounding != "stochastic":
        return None
    if isinstance(seed, torch.Generator) or seed is None:
        device = None if seed is None else seed.device  # a CUDA generator draws on its device
        return int(torch.randint(0, _MAX_SEED, (), generator=seed, device=device))
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int in [0, 2**63), a torch.Generator or None, got {type(seed).__name__}")
    if not 0 <= seed <= _MAX_SEED:
        raise ValueError(f"seed must be an int in [0, 2**63), got {seed}")
    return seed


def check_elem_dtype(elem_dtype) -> dtypes.DType:
    return dtypes.resolve(elem_dtype)
