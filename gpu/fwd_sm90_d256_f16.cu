// One kernel per translation unit keeps nvcc's per-job time and memory bounded.
#include "gpu/sm90/flash_fwd.cuh"

namespace ioattn::gpu::sm90 {

template <>
cudaError_t launch_flash_fwd<__half, 256>(const AttnParams& p, const DeviceGrid& dev) {
  // block_q, block_kv, consumer warpgroups, stages: checked against gpu_tile_sm90(256) inside launch_tile.
  return launch_tile<__half, 256, 128, 64, 2, 2>(p, dev);
}

}  // namespace ioattn::gpu::sm90
