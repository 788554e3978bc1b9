"""Which CUDA devices a call's GPU work ran on, as the profiler saw it."""

import torch


def kernel_devices(call):
    """(call's result, the indices of the devices its kernels and copies ran on), every GPU
    synchronized before the profile is read."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        result = call()
        for index in range(torch.cuda.device_count()):
            torch.cuda.synchronize(index)
    devices = {event.device_index for event in profile.events()
               if event.device_type == torch.autograd.DeviceType.CUDA}
    return result, devices
