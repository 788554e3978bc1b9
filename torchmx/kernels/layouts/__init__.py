"""Weight and scale layouts, in plain torch (no Triton needed): the vendor scale layouts
(`vendor`, whose exporters are re-exported here: `torchmx.kernels.layouts.to_blocked`, ...)
and the prepacked weight layouts that the linear kernels read (`tma_stream_layout`,
`fp4_wgmma_layout`, `mma_layout`; `fast_decode`: what their one-multiply decode takes).
"""

from .vendor import (blocked_size, from_blocked, shuffle_scale_aiter, shuffle_weight_aiter,
                     to_blocked, unshuffle_scale_aiter, unshuffle_weight_aiter)

__all__ = ["to_blocked", "from_blocked", "blocked_size", "shuffle_scale_aiter",
           "unshuffle_scale_aiter", "shuffle_weight_aiter", "unshuffle_weight_aiter"]
