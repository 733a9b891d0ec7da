// The SwiGLU hidden unit shared by every CUDA MoE path so they round identically.
#pragma once

namespace dsv41rt::kernels::cuda {

// silu(min(g, L)) * clamp(u, -L, L) (* scale): one hidden unit.
__device__ __forceinline__ float swiglu_unit(float g, float u, float limit, bool has_scale,
                                             float scale) {
  if (limit > 0.0f) {
    g = g > limit ? limit : g;
    u = u > limit ? limit : (u < -limit ? -limit : u);
  }
  const float h = g / (1.0f + expf(-g)) * u;
  return has_scale ? h * scale : h;
}

}  // namespace dsv41rt::kernels::cuda
